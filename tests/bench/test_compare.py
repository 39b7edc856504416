"""Compare (backend.bench.compare) against our real server with a tiny model under two target names: the
same workload and seed for each, one row each, /metrics samples and memory, JSON and a standalone HTML
report; and the startup-phase parser on vLLM's own log lines (the real vLLM run is in
test_external_vllm.py)."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from app import main as app_main
from backend.bench.compare import CompareTarget, Comparison, Workload, run_compare, run_target, split_runs
from backend.bench.compare_offline import run_offline
from backend.bench.compare_report import (
    bar_lines,
    fairness_line,
    figures,
    format_table,
    note_lines,
    write_report,
)
from backend.engine.config import EngineConfig
from backend.export.startup import Startup, error_lines
from tests.engine_utils import tiny_model

# Lines from a real `vllm serve` (0.32.0, CPU) log, in order; the last one is a failed start.
VLLM_LOG = [
    "(EngineCore pid=31940) INFO 12-01 10:02:36 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with",
    "(Worker pid=32112) INFO 12-01 10:03:09 [cpu_model_runner.py:68] Starting to load model /tmp/dense...",
    "(Worker pid=32112) INFO 12-01 10:03:09 [default_loader.py:501] Loading weights took 0.49 seconds",
    "(Worker pid=32112) INFO 12-01 10:03:12 [cpu_model_runner.py:87] Warming up model for the compilation...",
    "(EngineCore pid=31940) INFO 12-01 10:06:11 [kv_cache_utils.py:2327] CPU KV cache size: 46,592 tokens, "
    "Maximum concurrency for 2,048 tokens per request: 22.75x",
]
FAILURE = (
    "(Worker pid=32112) ERROR 12-01 10:06:11 [multiproc_executor.py:1063] ValueError: No common block size "
    "for 16 (CPU_ATTN: [MultipleOf(32)])."
)


def test_startup_phases_follow_vllms_log_lines():
    startup, seen = Startup("vllm"), []
    for line in VLLM_LOG:
        startup.feed(line)
        seen.append((startup.progress, startup.phase))
    assert [p for p, _ in seen] == sorted(p for p, _ in seen) and len(set(seen)) == len(VLLM_LOG)
    assert seen[1][1] == "loading weights" and seen[3][1] == "compiling / warming up"
    assert startup.kv_cache_tokens == 46592 and startup.phase == "KV cache allocated"
    startup.feed("Loading weights took 1 s")  # a late line never moves the bar back
    assert startup.phase == "KV cache allocated"


def test_error_lines_lead_with_the_engines_exception():
    lines = error_lines([*VLLM_LOG, "Traceback (most recent call last):", FAILURE, "  raise", "done"])
    assert lines[0] == "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."
    assert lines[-1] == "done"


def test_compare_runs_the_same_workload_on_each_target_and_writes_reports(served, tmp_path):
    engine, server = served
    targets = [
        CompareTarget(
            name,
            f"{server.url}/v1",
            "tiny",
            pids=lambda: [os.getpid()],
            block_size=engine.stats().block_size,
        )
        for name in ("first", "second")
    ]
    seen: list[str] = []
    workload = Workload(dataset="chat", num_prompts=6, max_concurrency=2, input_len=64, output_len=8)
    comparison = run_compare(targets, workload, progress=lambda name, done, total: seen.append(name))
    first, second = comparison.rows()
    assert not [r.error for run in comparison.runs for r in run.result.requests if r.error]
    assert (first.target, second.target) == ("first", "second") and seen == ["first"] * 6 + ["second"] * 6
    for row in (first, second):
        assert row.engine == "embedded" and row.completed == 6 and row.failed == 0
        assert row.output_tok_s > 0 and row.ttft_p50_ms > 0 and row.ttft_p99_ms >= row.ttft_p50_ms
        assert row.kv_cache_tokens == 256 * engine.stats().block_size
        assert row.peak_rss_bytes > 50 * 1024**2
    a, b = (run.result for run in comparison.runs)
    assert a.total_input_tokens == b.total_input_tokens  # the same prompts (same dataset and seed)
    assert all(len(run.samples) >= 2 for run in comparison.runs)
    latency = figures(comparison)["latency"]  # targets named once, by the legend (not under each box)
    assert {t.name for t in latency.data if t.showlegend} == {"first", "second"}
    assert all(axis.showticklabels is False for axis in latency.select_xaxes())
    table = format_table(comparison.rows())
    assert table.count("\n") == 3 and "| first | embedded |" in table
    paths = write_report(comparison, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert [r["target"] for r in data["rows"]] == ["first", "second"]
    assert data["workload"]["dataset"] == "chat" and len(data["results"]["first"]["ttfts"]) == 6
    page = paths["html"].read_text()
    assert "data-target='second'" in page and "Plotly.newPlot" in page
    assert '<script src="https://cdn.plot.ly' not in page
    assert len(page) > 1_000_000  # plotly.js is inline: the report opens offline


def test_one_server_given_twice_serves_neither_run_from_the_others_prefix_cache(served):
    """The same engine as both targets: the second run's prompts have the first's lengths and token counts
    but a salt of their own, so the engine's prefix-cache hits do not rise from the first run's prompts
    (before, the second run re-sent the first's prompts and was served from its cache); the report says so."""
    engine, server = served
    model = tiny_model("llama")[0]
    targets = [
        CompareTarget(name, f"{server.url}/v1", "tiny", block_size=engine.stats().block_size)
        for name in ("first", "again")
    ]
    workload = Workload("random", num_prompts=4, max_concurrency=2, input_len=48, output_len=4, seed=7)
    workload = replace(workload, tokenizer=model)
    hits_before = engine.stats().prefix_cache_hits_total
    comparison = run_compare(targets, workload)
    first, again = comparison.rows()
    assert engine.stats().prefix_cache_hits_total == hits_before  # no block of any prompt was reused
    assert (first.prefix_cache_hits, again.prefix_cache_hits) == (0, 0)  # as /metrics counted each run
    a, b = (run.result for run in comparison.runs)
    assert a.total_input_tokens == b.total_input_tokens > 4 * 48  # equal counts, each with its salt
    assert first.prompt_salt != again.prompt_salt and first.prompt_salt.startswith("[")
    line = fairness_line(comparison)
    assert "salt of its own" in line and "first 0, again 0" in line and line in note_lines(comparison)


def test_offline_column_runs_the_served_prompts_and_states_the_bar(served):
    """One concurrency's slice served, then the same prompts through LLM.generate in a subprocess: the
    same prompt tokens as the server counted, a figure, and issue 19's served/offline line."""
    engine, server = served
    model = tiny_model("llama")[0]
    base = Workload(
        dataset="random", num_prompts=4, input_len=24, output_len=6, ignore_eos=True, tokenizer=model
    )
    warm, (run,) = split_runs(base, [2], warmup=2)
    target = CompareTarget("embedded", f"{server.url}/v1", "tiny", block_size=engine.stats().block_size)
    served_run = run_target(target, run)
    assert served_run.row.max_concurrency == 2 and served_run.result.total_input_tokens == 4 * 24
    offline = run_offline(
        EngineConfig(model, max_num_seqs=2, num_kv_blocks=256, max_model_len=512), run, warm
    )
    assert offline.output_tok_s > 0, offline.detail
    assert offline.prompt_tokens == 4 * 24 and "2 warm-up prompts untimed" in offline.detail
    lines = bar_lines(Comparison(base, [served_run], [offline]))
    assert len(lines) == 1  # no peer at c=2, and the p99 TTFT bar is set at c=16 only
    assert lines[0].startswith("c=2: served / offline output tok/s") and "DIFFER" not in lines[0]


def test_compare_cli_needs_two_targets(capsys):
    with pytest.raises(SystemExit, match="at least two"):
        app_main(["compare", "--target", "vllm"])


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_prompts", 10_001), ("max_concurrency", 1025), ("input_len", 200_000), ("output_len", 0)],
)
def test_a_comparison_is_bounded_whoever_asks(field, value):
    """The CLI, the Compare tab and the Python API build the same Workload: bounded, public or not."""
    with pytest.raises(ValueError, match=f"{field} must be in 1.."):
        Workload(**{field: value})
    with pytest.raises(ValueError, match="at most 16 concurrencies"):
        split_runs(Workload(), list(range(1, 18)), warmup=0)
