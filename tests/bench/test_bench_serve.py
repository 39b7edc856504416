"""The serving benchmark against our real server (tiny random model, small N), its datasets, arrival
process, JSON, plot and CLI."""

from __future__ import annotations

import json
import math
import random
import statistics

import numpy as np
import pytest

from app import main as app_main
from backend.bench.datasets import CORPUS_PATH, sample_requests
from backend.bench.plots import latency_figure
from backend.bench.results import percentile
from backend.bench.serve import BenchConfig, arrival_intervals, run_benchmark
from tests.server_utils import wait_until

SUMMARY_KEYS = {
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
}
LATENCY_KEYS = {
    f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p90", "p99")
}


def config(server, **kw) -> BenchConfig:
    base = dict(
        base_url=f"{server.url}/v1",
        model="tiny",
        num_prompts=12,
        input_len=24,
        output_len=6,
        ignore_eos=True,
        max_concurrency=4,
    )
    return BenchConfig(**base | kw)


def test_chat_benchmark_reports_every_field_and_exact_token_counts(served):
    engine, server = served
    before = engine.stats()
    calls = []
    result = run_benchmark(
        config(server, dataset="chat"), progress=lambda done, total: calls.append((done, total))
    )
    after = engine.stats()
    data = result.to_dict()
    assert set(data) >= SUMMARY_KEYS | LATENCY_KEYS
    assert data["completed"] == 12 and data["failed"] == 0 and data["errors"] == []
    assert (
        data["total_output_tokens"]
        == 12 * 6
        == after.generation_tokens_total - before.generation_tokens_total
    )
    assert data["total_input_tokens"] == after.prompt_tokens_total - before.prompt_tokens_total
    assert data["request_throughput"] == pytest.approx(12 / data["duration"])
    assert data["output_throughput"] == pytest.approx(72 / data["duration"])
    assert data["total_token_throughput"] == pytest.approx(
        (72 + data["total_input_tokens"]) / data["duration"]
    )
    for m in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < data[f"median_{m}_ms"] <= data[f"p90_{m}_ms"] <= data[f"p99_{m}_ms"]
    assert data["mean_e2el_ms"] > data["mean_ttft_ms"]
    # a gap per chunk after the first: a reader slower than the steps gets several tokens in one chunk
    # (the engine keeps the newest output, as vLLM's collector merges them), so only the bounds are fixed
    assert len(data["itls"]) == 12 and all(len(gaps) <= 5 for gaps in data["itls"])
    assert any(data["itls"]) and all(gap >= 0 for gaps in data["itls"] for gap in gaps)
    assert calls == [(i, 12) for i in range(1, 13)]
    assert json.loads(json.dumps(data, allow_nan=False))["config"]["request_rate"] == "inf"
    fig = latency_figure(result)
    assert [t.name for t in fig.data] == ["TTFT", "TPOT", "ITL", "E2EL"]
    assert len(fig.data[0].x) == 12


def test_random_poisson_and_prefix_repetition_datasets_run(served):
    engine, server = served
    result = run_benchmark(
        config(server, dataset="random", request_rate=40.0, burstiness=0.5, endpoint="completions")
    )
    assert result.completed == 12 and result.failed == 0
    hits_before = engine.stats().prefix_cache_hits_total
    result = run_benchmark(
        config(server, dataset="prefix-repetition", input_len=80, prefix_len=64, num_prefixes=2)
    )
    assert result.completed == 12
    assert (
        engine.stats().prefix_cache_hits_total - hits_before >= 10 * 32
    )  # shared 64-word prefixes were reused


def test_failures_are_counted_with_their_errors(served):
    result = run_benchmark(config(served[1], model="no-such-model", num_prompts=3))
    assert result.completed == 0 and result.failed == 3
    assert all("HTTP 404" in e and "no-such-model" in e for e in result.to_dict()["errors"])


def test_bench_command_writes_json_and_reports_leaked_blocks(served, tmp_path, capsys):
    engine, server = served
    out = tmp_path / "result.json"
    rows = [
        {"prompt": "Once upon a time"},
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
    ]
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = f"bench --base-url {server.url}/v1 --model tiny --dataset chat --num-prompts 6 --max-concurrency 3"
    args += f" --input-len 20 --output-len 4 --ignore-eos --out {out}"
    code = app_main(args.split())
    assert code == 0
    printed = capsys.readouterr().out
    assert "Serving Benchmark Result" in printed and "P99 TTFT (ms):" in printed
    assert "KV blocks used 0.0 of 256.0" in printed
    assert json.loads(out.read_text())["completed"] == 6
    wait_until(lambda: engine.stats().num_requests_running == 0, what="idle")
    mixed = (
        f"bench --base-url {server.url}/v1 --model tiny --dataset {dataset} --num-prompts 4 --output-len 5"
    )
    assert app_main(mixed.split()) == 0  # prompts go to /v1/completions, messages to /v1/chat/completions
    with pytest.raises(SystemExit, match="holds chat messages"):
        app_main([*mixed.split(), "--endpoint", "completions"])


def test_jsonl_dataset_is_validated(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt here"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: each line needs \"prompt\""):
        sample_requests(BenchConfig("http://x", "m", dataset=str(bad)))
    with pytest.raises(ValueError, match="unknown dataset 'sharegpt'"):
        sample_requests(BenchConfig("http://x", "m", dataset="sharegpt"))


def test_chat_dataset_comes_from_the_bundled_corpus():
    assert 10_000 < CORPUS_PATH.stat().st_size < 500_000
    corpus = CORPUS_PATH.read_text()
    chat = BenchConfig("http://x", "m", dataset="chat", num_prompts=20, input_len=60, seed=3)
    requests = sample_requests(chat)
    assert requests == sample_requests(chat)  # same seed, same prompts
    for req in requests:
        _instruction, passage = req.messages[0]["content"].split("\n\n", 1)
        assert passage.splitlines()[0] in corpus and len(passage.split()) >= 60
    assert len({r.messages[0]["content"] for r in requests}) == 20


def test_arrivals_are_poisson_or_gamma_with_the_requested_rate():
    assert arrival_intervals(5, math.inf, 1.0, random.Random(0)) == [0.0] * 5
    for burstiness in (1.0, 0.25, 4.0):
        gaps = arrival_intervals(20000, 10.0, burstiness, random.Random(1))
        assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.05)
        cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
        assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)  # gamma(k): CV = 1/sqrt(k)


def test_percentile_matches_numpy():
    rng = random.Random(2)
    values = [rng.random() for _ in range(37)]
    for p in (50, 90, 99):
        assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))


def test_invalid_configs_are_refused_clearly():
    with pytest.raises(ValueError, match="request_rate must be > 0"):
        BenchConfig("http://x", "m", request_rate=0)
    with pytest.raises(ValueError, match="max_concurrency must be >= 1"):
        BenchConfig("http://x", "m", max_concurrency=0)
