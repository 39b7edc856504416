"""The captured decode step (decode_graph.py) computes what the model's modules compute: every step's
logits bit-identical to enforce_eager's, and so the same greedy tokens, on a tiny random bf16 model and on
the default GGUF kept at Q4_1, on a GGUF of K-types kept row by row (captured up to quant_gemv's 8 rows),
with an fp8 KV cache, while batches shrink and grow, under preemption,
with prefix-cache hits and with speculative decoding (its verify steps take the modules). A planted
stale buffer fails the comparison. The embedding is one of the captured calls (a dense table's rows, the
default GGUF's interleaved Q8_0 ones). Models the graph cannot serve keep the modules and say why."""

from __future__ import annotations

import array

import pytest
import torch

from backend.default_model import packaged_gguf
from backend.engine import LLM, SamplingParams, cpu_kernels, graph_ops, loader
from backend.engine.decode_graph import DecodeGraph
from backend.engine.decode_graph_support import unsupported_layer
from backend.engine.device import cpu_has_fast_bf16
from backend.planner.cpu_host import CPUHost
from tests.engine_utils import WINDOW, assert_engine_clean, planned_graph_bytes, prompts, tiny_model
from tests.features_model_utils import SOFT_CAP, FeaturesForCausalLM, features_model
from tests.gguf_utils import VOCAB, Q, write_tiny_gguf

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def recorded(llm: LLM) -> dict[str, list]:
    """Record each step's logits (copied: the graph's are a view of its buffer) and count graph steps."""
    runner = llm.llm_engine.runner
    log: dict[str, list] = {"logits": [], "graph_steps": []}
    execute = runner.execute

    def record(scheduled):
        sampling, logits = execute(scheduled)
        log["logits"].append(logits.clone())
        return sampling, logits

    runner.execute = record
    if runner.decode_graph is not None:
        run = runner.decode_graph.run

        def count(step):
            log["graph_steps"].append(len(step.ints) // 4)
            return run(step)

        runner.decode_graph.run = count
    return log


def run_both(
    model: str,
    batch: list[list[int]],
    params: list[SamplingParams],
    embeds: bool = True,
    dtype: str = "bfloat16",
    **engine_kwargs,
):
    """(eager log, captured log, captured LLM) after generating batch with each; the token ids and every
    step's logits are checked equal. embeds: the embedding is a captured call (a dense table or an
    interleaved Q8_0 one)."""
    llms = {eager: LLM(model, dtype=dtype, device="cpu", enforce_eager=eager, **engine_kwargs)
            for eager in (True, False)}  # fmt: skip
    if llms[False].llm_engine.runner.decode_graph is None:
        pytest.skip("this CPU's kernels cannot capture the model (no AVX512_BF16 gemm_bf16 / interleaved)")
    assert llms[True].llm_engine.runner.decode_graph is None
    assert llms[False].llm_engine.runner.decode_graph.embeds_in_graph == embeds
    logs = {eager: recorded(llm) for eager, llm in llms.items()}
    outputs = {eager: llm.generate(batch, params) for eager, llm in llms.items()}
    tokens = {eager: [out.outputs[0].token_ids for out in outs] for eager, outs in outputs.items()}
    assert tokens[False] == tokens[True]
    assert len(logs[False]["logits"]) == len(logs[True]["logits"])
    for step, (captured, eager) in enumerate(zip(logs[False]["logits"], logs[True]["logits"], strict=True)):
        assert torch.equal(captured, eager), f"step {step}: logits differ"
    for llm in llms.values():
        assert_engine_clean(llm)
    return logs[True], logs[False], llms[False]


def joining_batch(vocab: int = 49152) -> tuple[list[list[int]], list[SamplingParams]]:
    """Six requests, three running at a time, finishing at different steps: batches shrink, then grow as
    the next ones join (their prefill steps take the modules)."""
    batch = prompts(lengths=(5, 17, 33, 1, 40, 16), seed=3, vocab=vocab)
    return batch, [greedy(n) for n in (12, 30, 7, 20, 9, 25)]


# Granite: its multipliers folded into weights; Phi-3: its checkpoint's fused qkv_proj and gate_up_proj;
# Qwen3: q/k norm per head
@pytest.mark.parametrize("arch", ["llama", "granite", "phi3", "qwen3"])
def test_tiny_bf16_model_logits_equal_eager_as_batches_change(arch):
    batch, params = joining_batch()
    eager, captured, _ = run_both(tiny_model(arch)[0], batch, params, max_num_seqs=3)
    sizes = set(captured["graph_steps"])
    assert {1, 2, 3} <= sizes, f"graph batch sizes {sorted(sizes)}"
    assert len(captured["graph_steps"]) < len(captured["logits"])  # prefill steps took the modules
    assert not eager["graph_steps"]


def test_tiny_model_with_fp8_kv_cache_preemption_and_prefix_hits():
    shared = prompts(lengths=(40,), seed=5)[0]
    batch = [shared + p for p in prompts(lengths=(3, 9, 20, 2), seed=6)]
    params = [greedy(n) for n in (40, 33, 26, 45)]
    _, captured, llm = run_both(
        tiny_model("llama_mqa_tied")[0],
        batch,
        params,
        kv_cache_dtype="fp8",
        num_kv_blocks=14,
        max_num_seqs=4,
        max_num_batched_tokens=64,
    )
    stats = llm.stats()
    assert stats.num_preemptions_total > 0
    assert stats.prefix_cache_hits_total > 0
    assert captured["graph_steps"]


def test_windowed_model_with_freed_blocks_logits_equal_eager():
    """Mistral with a window of 20 on every layer: the captured attention op carries the window, and the
    blocks freed before it (NULL_BLOCK in the tables it copies) are never read."""
    batch = prompts(lengths=(5, 40, 70), seed=8)
    _, captured, llm = run_both(tiny_model("mistral_window")[0], batch, [greedy(30)] * 3, num_kv_blocks=20)
    assert llm.stats().num_kv_blocks_freed_by_window_total > 0
    assert captured["graph_steps"]


def test_every_attention_feature_is_captured_and_logits_equal_eager(monkeypatch):
    """Partial rotary, a soft-cap and sinks on layer 0, no RoPE and a window of 20 on layer 1, GELU(tanh)
    MLPs (tests/features_model_utils.py): every layer is captured (rope_and_cache with the layer's
    rotary_dim, the attention op with its options, gelu_tanh_and_mul) and the logits are the modules'."""
    monkeypatch.setattr(loader, "model_class", lambda architecture: FeaturesForCausalLM)
    folder = features_model()
    model = LLM(folder, dtype="bfloat16", device="cpu", enforce_eager=True).llm_engine.runner.model
    assert [unsupported_layer(layer) for layer in model.layers] == [None, None]
    first, second = model.attention_specs
    assert (first.rotary_dim, first.logits_soft_cap, first.has_sinks) == (8, SOFT_CAP, True)
    assert (second.rotary_dim, second.sliding_window) == (0, WINDOW)
    assert torch.equal(model.layers[0].self_attn.kernel_sinks, torch.linspace(-1.0, 2.0, 4))
    batch = prompts(lengths=(5, 40, 70), seed=9)
    _, captured, _ = run_both(folder, batch, [greedy(30)] * 3, max_num_seqs=3)
    assert captured["graph_steps"]


def test_speculative_verify_steps_take_the_modules():
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    ngram |= {"disable_by_batch_size": 1024}
    batch = [p[:10] * 4 for p in prompts(lengths=(10, 10), seed=7)]  # repeats: the n-gram proposer drafts
    _, captured, llm = run_both(
        tiny_model("llama")[0], batch, [greedy(24)] * 2, speculative_config=ngram, max_num_seqs=2
    )
    stats = llm.llm_engine.speculator.stats
    assert stats.num_draft_tokens > 0
    assert len(captured["graph_steps"]) < len(captured["logits"])


def test_default_gguf_q4_1_logits_equal_eager():
    batch, params = joining_batch()
    embeds = cpu_kernels.interleaved_available()  # its tied Q8_0 embedding is interleaved: a captured call
    _, captured, llm = run_both(str(packaged_gguf()), batch[:4], params[:4], embeds, max_num_seqs=3)
    assert llm.llm_engine.quantization.startswith("gguf"), llm.llm_engine.quantization
    assert len(set(captured["graph_steps"])) >= 2


def test_k_quant_gguf_rows_are_captured_up_to_the_gemv_row_limit(tmp_path):
    """GGUF K-types stay row by row (not interleaved): quant_gemv serves them for up to 8 rows, as the eager
    module does, the Q6_K lm_head's bf16 logits widened in place; a step with more rows runs the modules.
    Nine requests, at most 10 at a time, finishing at different steps: batches of 9 and fewer."""
    mixed = {"attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q6_K, "attn_output": Q.Q4_0}
    mixed |= {"ffn_gate": Q.Q4_1, "ffn_up": Q.Q6_K, "ffn_down": Q.Q4_K}
    path = write_tiny_gguf(tmp_path / "tiny-k-quants.gguf", mixed, Q.Q4_K, output=Q.Q6_K)
    batch = prompts(lengths=(5, 9, 3, 12, 7, 2, 4, 6, 8), seed=8, vocab=VOCAB)
    params = [greedy(n) for n in (6, 9, 12, 14, 16, 18, 20, 22, 24)]
    _, captured, llm = run_both(str(path), batch, params, embeds=False, max_num_seqs=10)
    graph = llm.llm_engine.runner.decode_graph
    assert graph.max_rows == 8 and graph.logits.dtype == torch.float32
    assert "Q4_K" in llm.llm_engine.quantization and "Q6_K" in llm.llm_engine.quantization
    sizes = set(captured["graph_steps"])
    assert {1, 8} <= sizes and max(sizes) == 8, f"graph batch sizes {sorted(sizes)}"


def test_q4_0_mix_with_a_q6_k_lm_head_is_captured_at_16_rows(tmp_path):
    """llama-quantize's Q4_0 mix: Q4_0 projections (interleaved) and a tied Q6_K embedding as the lm_head,
    kept row by row. quant_gemm_q6_k serves it up to 64 rows, so 16 sequences decode in the captured step
    (before it, quant_gemv's 8 rows sent them to the modules), logits equal to the eager modules' (which
    take the same kernel past 8 rows), greedy tokens identical."""
    linear = {kind: Q.Q4_0 for kind in ("attn_q", "attn_k", "attn_v", "attn_output")}
    linear |= {kind: Q.Q4_0 for kind in ("ffn_gate", "ffn_up", "ffn_down")}
    path = write_tiny_gguf(tmp_path / "tiny-q4_0-mix.gguf", linear, Q.Q6_K)
    batch = prompts(lengths=tuple(range(3, 35, 2)), seed=11, vocab=VOCAB)
    _, captured, llm = run_both(str(path), batch, [greedy(10)] * 16, embeds=False, max_num_seqs=16)
    assert llm.llm_engine.runner.decode_graph.max_rows == 16
    assert 16 in captured["graph_steps"], f"graph batch sizes {sorted(set(captured['graph_steps']))}"


def test_gguf_rows_in_fp32_on_a_simulated_cpu_without_fast_bf16(monkeypatch):
    """A CPU without AVX512_BF16 / AMX (AVX2-only EPYCs; simulated: the flag read as absent) computes in
    fp32, its GGUF blocks row by row: quant_gemv's fp32 kernels are captured there, the lm_head writing
    fp32 logits itself, for steps of up to 8 rows. On a CPU with fast bf16, fp32 is not captured."""
    batch, params = joining_batch()
    if cpu_has_fast_bf16():
        with pytest.raises(pytest.skip.Exception):  # fp32 is not this CPU's compute dtype: not captured
            run_both(str(packaged_gguf()), batch[:1], params[:1], False, "float32", max_num_seqs=3)
        monkeypatch.setattr(graph_ops, "cpu_has_fast_bf16", lambda: False)
    _, captured, llm = run_both(str(packaged_gguf()), batch[:4], params[:4], False, "float32", max_num_seqs=3)
    graph = llm.llm_engine.runner.decode_graph
    assert graph.max_rows == 3 and graph.hidden.dtype == torch.float32
    stats = llm.stats()
    monkeypatch.setattr(CPUHost, "has_fast_bf16", property(lambda host: False))  # the planner's view too
    assert planned_graph_bytes(llm, stats) == stats.decode_graph_bytes == graph.buffer_bytes
    assert len(set(captured["graph_steps"])) >= 2


def test_a_stale_buffer_fails_the_comparison(monkeypatch):
    step_rows = DecodeGraph.step_rows
    first_lens: dict[int, array.array] = {}

    def stale_context_lens(self, decodes):  # planted bug: context lengths of the first step of each size
        step = step_rows(self, decodes)
        if step is not None:
            rows = len(step.ints) // 4
            step.ints[3 * rows :] = first_lens.setdefault(rows, step.ints[3 * rows :])
        return step

    monkeypatch.setattr(DecodeGraph, "step_rows", stale_context_lens)
    with pytest.raises(AssertionError) as failure:
        run_both(tiny_model("llama")[0], *joining_batch(), max_num_seqs=3)
    assert "diff" in str(failure.value) or "logits differ" in str(failure.value)


@pytest.mark.parametrize("arch", ["phi4_mini", "smollm3"])
def test_partial_rotary_and_nope_layers_are_captured(arch):
    """Phi-4-mini's partial rotary and SmolLM3's layers without RoPE run in the captured step, and the
    planner plans its buffers as the engine holds them."""
    llm = LLM(tiny_model(arch)[0], dtype="bfloat16", device="cpu")
    stats = llm.stats()
    assert (
        (llm.llm_engine.runner.decode_graph is not None)
        == cpu_has_fast_bf16()
        == (stats.decode_graph_bytes > 0)
    )
    assert planned_graph_bytes(llm, stats) == stats.decode_graph_bytes


@pytest.mark.parametrize(
    ("arch", "dtype", "reason"),
    [
        ("olmo2", "bfloat16", "a layer of type SandwichDecoderLayer"),
        ("gemma3", "bfloat16", "a layer of type SandwichDecoderLayer"),
        ("llama", "float32", "a projection not on gemm_bf16"),
    ],
)
def test_unsupported_models_keep_the_modules_and_say_why(arch, dtype, reason, caplog):
    caplog.set_level("INFO", logger="backend.engine.llm_engine")
    llm = LLM(tiny_model(arch)[0], dtype=dtype, device="cpu")
    assert llm.llm_engine.runner.decode_graph is None
    assert f"decode steps run the model's modules: {reason}" in caplog.text
    assert planned_graph_bytes(llm, llm.stats()) == 0  # the planner's registry traits and config agree
