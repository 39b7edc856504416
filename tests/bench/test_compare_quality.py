"""Compare's quality columns (backend/bench/compare_quality.py) against our real server: a target served
over HTTP (top-20 prompt logprobs) has the perplexity and top-1 agreement the engine computes in this
process from whole rows, and a KL that is a lower bound of the exact one; a server without prompt logprobs
gets a note instead of figures; the table shows the columns."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from backend.bench.compare import CompareRow, CompareTarget, Comparison, Workload
from backend.bench.compare_quality import (
    DEFAULT_CHUNKS,
    DEFAULT_CTX,
    TargetQuality,
    attach,
    engine_reference,
)
from backend.bench.compare_report import format_table, note_lines
from backend.quality.config import QualityConfig
from backend.quality.measure import run_quality
from tests.engine_utils import tiny_model
from tests.server_utils import RunningServer, start_engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FP32 = "dtype=float32,device=cpu"


@pytest.fixture(scope="module")
def llama_server():
    """A tiny random llama served in fp32 as "tiny"."""
    from backend.server import build_app

    engine = start_engine(tiny_model("llama")[0], dtype="float32", device="cpu", num_kv_blocks=128)
    server = RunningServer(build_app(lambda: engine, served_model_name="tiny"))
    yield CompareTarget("tiny-server", f"{server.url}/v1", "tiny")
    server.stop()
    engine.shutdown()


def row(target: str) -> CompareRow:
    figures = dict.fromkeys(("duration_s", "output_tok_s", "total_tok_s"), 1.0)
    latencies = dict.fromkeys(
        ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms"), 1.0
    )
    return CompareRow(
        target, "embedded", 1, 1, 0, **figures, **latencies, peak_rss_bytes=None, kv_cache_tokens=None,
        planned_weights_bytes=None, planned_kv_cache_tokens=None,
    )  # fmt: skip


def test_a_served_model_scores_as_the_same_model_in_process(llama_server):
    with engine_reference(f"{tiny_model('llama')[0]}@{FP32}") as quality:
        scored = quality.score_target(llama_server)
        reference = quality.reference
    assert reference is not None and reference.kld_mean == 0.0 and reference.same_top_p == 1.0
    result = scored.result
    assert result is not None, scored.note
    assert result.num_tokens == DEFAULT_CHUNKS * (DEFAULT_CTX // 2 - 1)
    assert result.ppl == pytest.approx(reference.ppl, rel=1e-4)
    assert result.same_top_p == 1.0 and result.kld_kind == "lower bound"
    assert 0.0 <= result.kld_mean < 1e-5


def test_a_served_models_kl_is_a_lower_bound_of_the_exact_one(llama_server):
    """Reference: another model (llama_mqa_tied) in this process; the served llama's PPL and top-1 equal
    the exact run's (app.py quality on the same chunks), its KL from the top 20 lies in (0, exact]."""
    other = f"{tiny_model('llama_mqa_tied')[0]}@{FP32}"
    with engine_reference(other) as quality:
        served = quality.score_target(llama_server).result
    config = QualityConfig(
        model=(f"{tiny_model('llama')[0]}@{FP32}",), reference=other, ctx=DEFAULT_CTX, chunks=DEFAULT_CHUNKS
    )
    (exact,) = run_quality(config).results
    assert served is not None and exact.kld_mean is not None and served.kld_mean is not None
    assert math.log(served.ppl) == pytest.approx(math.log(exact.ppl), abs=1e-4)
    assert served.same_top_p == pytest.approx(exact.same_top_p, abs=1e-9)
    assert exact.kld_mean > 0.1  # two different models
    assert 0.0 < served.kld_mean <= exact.kld_mean + 1e-6
    assert served.kld_p99 is not None and exact.kld_p99 is not None and served.kld_p99 <= exact.kld_p99 + 1e-6

    rows = [row("tiny-server c=1"), row("tiny-server c=2"), row("other")]
    attach(rows, "tiny-server", TargetQuality(served))
    table = format_table(rows)
    assert table.count(f"{served.ppl:.3f}") == 2 and "≥ " in table  # both of its rows, marked a bound
    assert rows[2].quality is None


def test_a_server_without_prompt_logprobs_gets_a_note(llama_server):
    no_api = CompareTarget("no-logprobs", llama_server.base_url.removesuffix("/v1"), "tiny")  # 404s
    with engine_reference(f"{tiny_model('llama')[0]}@{FP32}", chunks=2) as quality:
        scored = quality.score_target(no_api)
        reference = quality.reference
    assert scored.result is None and "gave no prompt_logprobs" in scored.note
    rows = [row("no-logprobs")]
    attach(rows, "no-logprobs", scored)
    runs = [SimpleNamespace(row=rows[0])]  # Comparison.rows() reads each run's row only
    comparison = Comparison(Workload(), runs, quality_reference=reference)  # type: ignore[arg-type]
    lines = note_lines(comparison)
    assert any(line.startswith("quality: 254 tokens") for line in lines)
    assert any(line.startswith("quality of no-logprobs: none (no-logprobs:") for line in lines)
    assert "| – | – | – | – |" in format_table(rows)
