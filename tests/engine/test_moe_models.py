"""The mixture-of-experts families (Mixtral, Qwen3-MoE, OLMoE, Granite-MoE) run end to end: greedy
outputs of tiny random fp32 models token-identical to transformers with chunked prefill, prefix caching
and preemption on, from the safetensors checkpoint and from llama.cpp's own F32 GGUF of it; the
converter's Q8_0 and a Q4_0 requantization keep their experts as stored blocks and give the tokens the
same file gives decoded to dense weights. The captured decode step covers the MoE layers (bf16, and fp32
as a CPU without fast bf16 runs a GGUF; logits equal the modules' bit for bit). Expert-load statistics
count top_k assignments per token and MoE layer."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from backend.engine import LLM, SamplingParams, cpu_kernels
from backend.engine.layers.fused_moe import FusedMoE
from tests.engine_utils import assert_engine_clean, hf_greedy, prompts
from tests.gguf_family_utils import family_gguf, tiny_family_model
from tests.moe_utils import assert_captured_equals_eager

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAMILIES = ("mixtral", "qwen3moe", "olmoe", "granitemoe")
MAX_TOKENS = 20
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
# block_size 4 and 30 blocks preempt (a 70-token prompt and its continuation take 23); a 16-token budget
# chunks every prompt past it
STRESS = dict(block_size=4, num_kv_blocks=30, max_num_seqs=8, max_num_batched_tokens=16)


@cache
def hf_model(family: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_family_model(family), dtype=torch.float32).eval()


def batch(family: str) -> list[list[int]]:
    """Prompts around block boundaries, and three sharing a 40-token prefix (prefix-cache hits)."""
    vocab = hf_model(family).config.vocab_size
    shared = prompts(lengths=(40,), seed=4, vocab=vocab)[0]
    tails = prompts(lengths=(3, 8, 20), seed=5, vocab=vocab)
    return prompts(seed=6, vocab=vocab) + [shared + tail for tail in tails]


def generate(llm: LLM, prompts_: list[list[int]]) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(prompts_, GREEDY)]


def blocks(llm: LLM) -> list[FusedMoE]:
    return [m for m in llm.llm_engine.runner.model.modules() if isinstance(m, FusedMoE)]


@pytest.mark.parametrize("source", ["safetensors", "gguf_f32"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_transformers_under_chunking_prefix_hits_and_preemption(family, source):
    model = tiny_family_model(family) if source == "safetensors" else str(family_gguf(family, "f32"))
    llm = LLM(model, dtype="float32", device="cpu", enable_prefix_caching=True, **STRESS)
    requests = batch(family)
    expected = [hf_greedy(hf_model(family), p, MAX_TOKENS) for p in requests]
    assert generate(llm, requests) == expected
    assert generate(llm, requests[-3:]) == expected[-3:]  # again: the shared prefix's blocks are cached
    stats = llm.stats()
    assert stats.num_preemptions_total > 0
    assert stats.prefix_cache_hits_total >= 3 * 40 - 4
    assert stats.num_steps_total > 2 * MAX_TOKENS  # chunked: more steps than one prefill and the decodes
    assert len(blocks(llm)) == hf_model(family).config.num_hidden_layers
    assert_engine_clean(llm)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("family", FAMILIES)
def test_quantized_experts_stay_blocks_and_give_the_decoded_files_tokens(family, qtype, exact_products):
    """The experts as stored compute the decoded weights' function (int8 activations off: on AVX2 builds
    Q4_0 experts would round x to int8, csrc/int8_avx2.h; test_int8_dot.py bounds that)."""
    path = str(family_gguf(family, qtype))
    kept = LLM(path, dtype="float32", device="cpu", **STRESS)
    decoded = LLM(path, dtype="float32", device="cpu", dequantize_weights=True, **STRESS)
    for block in blocks(kept):  # as stored: GGUF blocks in the block, or their native panels
        if block.native is None:
            assert {w.qtype for w in block.quantized.values()} == {qtype}
        else:
            assert qtype in block.native.gate_up.function and qtype in block.native.down.function
    assert all(not b.quantized and b.native is None for b in blocks(decoded))
    requests = batch(family)[:6]
    assert generate(kept, requests) == generate(decoded, requests)
    assert kept.stats().quantization is not None and qtype.upper() in kept.stats().quantization
    assert_engine_clean(kept)


@pytest.mark.parametrize("family", ["mixtral", "granitemoe"])
def test_expert_tokens_total_counts_top_k_per_token_and_layer(family):
    llm = LLM(tiny_family_model(family), dtype="float32", device="cpu")
    assert llm.stats().expert_tokens_total == [[0] * 4] * 2  # 2 layers of 4 experts, nothing routed yet
    requests = prompts(lengths=(5, 17, 33), seed=8, vocab=hf_model(family).config.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)
    llm.generate(requests, params)
    tokens = sum(len(p) + 7 - 1 for p in requests)  # every prompt token, then each fed-back token
    top_k = hf_model(family).config.num_experts_per_tok
    counts = llm.stats().expert_tokens_total
    assert [sum(layer) for layer in counts] == [tokens * top_k] * 2
    assert all(min(layer) >= 0 for layer in counts) and max(map(max, counts)) < tokens  # one per token


def test_a_dense_model_has_no_expert_counts():
    llm = LLM(tiny_family_model("granite"), dtype="float32", device="cpu")
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
    assert llm.stats().expert_tokens_total == []


def test_expert_counts_are_a_prometheus_counter_per_layer_and_expert():
    from prometheus_client import CollectorRegistry, generate_latest

    from backend.server.metrics import EngineCollector

    llm = LLM(tiny_family_model("mixtral"), dtype="float32", device="cpu")
    llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: llm, lambda engine: "tiny"))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    counts = llm.stats().expert_tokens_total
    for layer, experts in enumerate(counts):
        for expert, count in enumerate(experts):
            line = (
                f'playground:moe_expert_tokens_total{{expert="{expert}",layer="{layer}",model_name="tiny"}}'
            )
            assert f"{line} {float(count)}" in text
    assert sum(map(sum, counts)) == 2 * (4 + 3 - 1) * 2  # 2 layers, 6 tokens, top-2


@pytest.mark.parametrize(
    ("family", "source"),
    [
        ("mixtral", "safetensors"),
        ("granitemoe", "safetensors"),
        ("olmoe", "safetensors"),
        ("mixtral", "q8_0"),
        ("mixtral", "q4_0"),
        ("qwen3moe", "q4_0"),
    ],
)
def test_the_captured_decode_step_covers_the_moe_layers(family, source):
    """bf16 (the experts on csrc/moe.cpp, dense or GGUF blocks; Granite's residual multiplier folded into
    its dense down experts; OLMoE's q/k norm across heads, Qwen3-MoE's per head): every step's logits of
    the captured decode step equal the modules' bit for bit, while batches shrink and grow under
    preemption."""
    from backend.engine.device import cpu_has_fast_bf16
    from backend.engine.graph_ops import Signature

    folder = tiny_family_model(family) if source == "safetensors" else str(family_gguf(family, source))
    engines = {
        eager: LLM(folder, dtype="bfloat16", device="cpu", enforce_eager=eager, **STRESS)
        for eager in (True, False)
    }
    if not cpu_has_fast_bf16():
        pytest.skip("this CPU's kernels cannot capture the model (no AVX512_BF16 gemm_bf16)")
    graph = engines[False].llm_engine.runner.decode_graph
    assert graph is not None
    moe_calls = [op for op in graph.ops if op.signature == Signature.MOE]
    assert len(moe_calls) == hf_model(family).config.num_hidden_layers
    assert_captured_equals_eager(engines, batch(family), (12, 30, 7, 20, 9, 25))


def test_fp32_moe_gguf_is_captured_with_its_router_on_linear_f32(monkeypatch):
    """A CPU without fast bf16 computes in fp32 (simulated here: the flag read as absent where the graph
    decides): OLMoE's Q4_0 GGUF, its F32 router on linear_f32 and its q/k norm on qk_norm, is captured,
    every step's logits the modules' bit for bit."""
    from backend.engine import graph_ops
    from backend.engine.graph_ops import Signature

    monkeypatch.setattr(graph_ops, "cpu_has_fast_bf16", lambda: False)
    folder = str(family_gguf("olmoe", "q4_0"))
    engines = {
        eager: LLM(folder, dtype="float32", device="cpu", enforce_eager=eager, **STRESS)
        for eager in (True, False)
    }
    graph = engines[False].llm_engine.runner.decode_graph
    assert graph is not None and graph.hidden.dtype == torch.float32
    layers = hf_model("olmoe").config.num_hidden_layers
    routers = [op for op in graph.ops if op.function == cpu_kernels.kernel_address("linear_f32")]
    assert len(routers) == layers
    assert sum(op.signature == Signature.QK_NORM for op in graph.ops) == layers
    assert_captured_equals_eager(engines, batch("olmoe"), (12, 30, 7, 20, 9, 25))


def test_qwen3_moe_dense_layers_by_mlp_only_layers_and_sparse_step(tmp_path):
    """Layer 0 dense by mlp_only_layers, layer 2 by decoder_sparse_step 2 (only layer 1 and 3 are MoE)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeConfig

    from backend.engine.layers.mlp import GatedMLP
    from tests.engine_utils import tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
        num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[0], eos_token_id=2,
        initializer_range=0.25,
    )  # fmt: skip
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", device="cpu", max_num_batched_tokens=16)
    layers = llm.llm_engine.runner.model.layers
    assert [type(layer.mlp) for layer in layers] == [GatedMLP, FusedMoE, GatedMLP, FusedMoE]
    requests = prompts(lengths=(5, 33), seed=9, vocab=len(tokenizer))
    assert generate(llm, requests) == [hf_greedy(model, p, MAX_TOKENS) for p in requests]
    assert len(llm.stats().expert_tokens_total) == 2
