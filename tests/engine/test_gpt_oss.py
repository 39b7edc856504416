"""gpt-oss (GptOssForCausalLM) runs end to end: a tiny random fp32 model (sliding-window and full layers
alternating, window 8 with prompts far past it; attention biases and sinks; YaRN; router and expert biases;
the clamped SwiGLU) greedy token-identical to transformers (eager attention) with chunked prefill, prefix
caching and preemption on. Its MXFP4 checkpoint (openai's on-disk layout) keeps the experts as stored
blocks and gives the tokens, and the logprobs within fp32 summation error, of transformers' own MXFP4
loader's dequantized model; dequantize_weights gives transformers' dense experts exactly. llama.cpp's
converter's GGUF files of both run too: F32 token-identical, the MXFP4 experts kept as stored with the
tokens of transformers' dequantized model."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from backend.engine import LLM, SamplingParams
from backend.engine.layers.fused_moe import FusedMoE
from backend.engine.models.gpt_oss import GptOssForCausalLM
from tests.engine_utils import assert_engine_clean, hf_greedy, prompts
from tests.gguf_utils import convert_hf_to_gguf
from tests.gpt_oss_utils import SLIDING_WINDOW, tiny_gpt_oss, tiny_gpt_oss_mxfp4
from tests.moe_utils import assert_captured_equals_eager

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
# block_size 4 and 30 blocks preempt (a 70-token prompt and its continuation take 22); a 16-token budget
# chunks every prompt past it (tests/engine/test_moe_models.py's settings)
STRESS = dict(block_size=4, num_kv_blocks=30, max_num_seqs=8, max_num_batched_tokens=16, max_model_len=112)
VOCAB = 49152  # the default tokenizer's ids (the harmony control tokens above it are left out of prompts)


@cache
def hf_model(mxfp4: bool = False) -> torch.nn.Module:
    """transformers' model, eager attention; the MXFP4 folder through its own loader, which dequantizes on a
    CPU (Mxfp4Config(dequantize=True): integrations/mxfp4.py's convert_moe_packed_tensors)."""
    from transformers import AutoModelForCausalLM, Mxfp4Config

    folder, extra = tiny_gpt_oss(), {}
    if mxfp4:
        folder, extra = tiny_gpt_oss_mxfp4(), {"quantization_config": Mxfp4Config(dequantize=True)}
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", **extra
    )
    return model.eval()


def batch() -> list[list[int]]:
    """Prompts within and far past the window, and three sharing a 40-token prefix (prefix-cache hits)."""
    shared = prompts(lengths=(40,), seed=4, vocab=VOCAB)[0]
    tails = prompts(lengths=(3, 8, 20), seed=5, vocab=VOCAB)
    return prompts(lengths=(1, 5, 9, 17, 33, 70), seed=6, vocab=VOCAB) + [shared + tail for tail in tails]


def generate(llm: LLM, requests: list[list[int]]) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(requests, GREEDY)]


def blocks(llm: LLM) -> list[FusedMoE]:
    return [m for m in llm.llm_engine.runner.model.modules() if isinstance(m, FusedMoE)]


def test_greedy_tokens_equal_transformers_under_chunking_prefix_hits_and_preemption():
    llm = LLM(tiny_gpt_oss(), dtype="float32", device="cpu", enable_prefix_caching=True, **STRESS)
    model = llm.llm_engine.runner.model
    assert isinstance(model, GptOssForCausalLM)
    assert model.sliding_windows == (SLIDING_WINDOW, None, SLIDING_WINDOW, None)
    assert all(spec.has_sinks for spec in model.attention_specs) and len(blocks(llm)) == 4
    requests = batch()
    expected = [hf_greedy(hf_model(), p, MAX_TOKENS) for p in requests]
    assert generate(llm, requests) == expected
    assert generate(llm, requests[-3:]) == expected[-3:]  # again: the shared prefix's blocks are cached
    stats = llm.stats()
    assert stats.num_preemptions_total > 0
    assert stats.prefix_cache_hits_total >= 3 * 40 - 4
    assert stats.num_steps_total > 2 * MAX_TOKENS  # chunked: more steps than one prefill and the decodes
    assert_engine_clean(llm)


def test_mxfp4_experts_stay_blocks_and_give_transformers_dequantized_tokens():
    llm = LLM(tiny_gpt_oss_mxfp4(), dtype="float32", device="cpu", enable_prefix_caching=True, **STRESS)
    for block in blocks(llm):  # as stored: MXFP4 blocks in the block, or their native panels
        if block.native is None:
            assert {w.qtype for w in block.quantized.values()} == {"mxfp4"}
        else:
            assert "mxfp4" in block.native.gate_up.function and "mxfp4" in block.native.down.function
        assert block.w13_weight.numel() == block.w2_weight.numel() == 0  # no dense copy of the experts
    assert "mxfp4" in (llm.stats().quantization or "")
    requests = batch()
    expected = [hf_greedy(hf_model(mxfp4=True), p, MAX_TOKENS) for p in requests]
    assert expected != [hf_greedy(hf_model(), p, MAX_TOKENS) for p in requests]  # the experts matter
    assert generate(llm, requests) == expected
    assert_engine_clean(llm)


def test_mxfp4_logprobs_equal_transformers_within_fp32_summation_error():
    """The first generated token's top-5 logprobs against transformers' log-softmax of its logits: the
    blocks decode exactly (tests/engine/test_mxfp4.py), so only the summation order differs (fp32: 1e-4
    absolute on logprobs of order 10)."""
    llm = LLM(tiny_gpt_oss_mxfp4(), dtype="float32", device="cpu", max_model_len=256)
    requests = prompts(lengths=(5, 33, 70), seed=7, vocab=VOCAB)
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
    for request, out in zip(requests, llm.generate(requests, params), strict=True):
        with torch.inference_mode():
            logits = hf_model(mxfp4=True)(torch.tensor([request])).logits[0, -1]
        reference = torch.log_softmax(logits.double(), -1)
        (entries,) = out.outputs[0].logprobs or [{}]
        assert len(entries) >= 5
        for token_id, logprob in entries.items():
            assert logprob.logprob == pytest.approx(reference[token_id].item(), abs=1e-4)


def test_dequantize_weights_gives_transformers_dense_experts_exactly():
    """dequantize_weights: the MXFP4 experts decoded at load into the dense parameters, equal to the
    weights transformers' loader dequantizes (its [E, H, 2I] with gate / up columns alternating, reordered
    to each expert's gate rows then up rows); the tokens are the kept blocks'."""
    dense = LLM(tiny_gpt_oss_mxfp4(), dtype="float32", device="cpu", dequantize_weights=True, **STRESS)
    for block, layer in zip(blocks(dense), hf_model(mxfp4=True).model.layers, strict=True):
        assert not block.quantized and block.native is None
        gate_up = layer.mlp.experts.gate_up_proj.transpose(1, 2)  # [E, 2I, H], gate / up rows alternating
        assert torch.equal(block.w13_weight, torch.cat((gate_up[:, 0::2], gate_up[:, 1::2]), 1))
        assert torch.equal(block.w2_weight, layer.mlp.experts.down_proj.transpose(1, 2))
    assert dense.stats().quantization is None
    requests = batch()[:6]
    expected = [hf_greedy(hf_model(mxfp4=True), p, MAX_TOKENS) for p in requests]
    assert generate(dense, requests) == expected
    assert_engine_clean(dense)


def test_the_captured_decode_step_covers_sinks_windows_and_mxfp4_experts():
    """bf16, the MXFP4 experts on csrc/moe.cpp: the captured decode step (attention with sinks and windows,
    one MoE call per layer) gives the modules' logits bit for bit, while batches shrink and grow."""
    from backend.engine.device import cpu_has_fast_bf16
    from backend.engine.graph_ops import Signature

    if not cpu_has_fast_bf16():
        pytest.skip("this CPU's kernels cannot capture the model (no AVX512_BF16 gemm_bf16)")
    engines = {
        eager: LLM(tiny_gpt_oss_mxfp4(), dtype="bfloat16", device="cpu", enforce_eager=eager, **STRESS)
        for eager in (True, False)
    }
    graph = engines[False].llm_engine.runner.decode_graph
    assert graph is not None
    assert len([op for op in graph.ops if op.signature == Signature.MOE]) == 4
    assert_captured_equals_eager(engines, batch(), (12, 30, 7, 20, 9))


@pytest.mark.parametrize("mxfp4", [False, True], ids=["f32", "mxfp4"])
def test_llama_cpp_gguf_files_run_token_identical(mxfp4):
    """The converter's F32 file of each checkpoint (it repacks MXFP4 experts as GGUF MXFP4 and splits
    gate_up and its bias into gate and up): experts kept as the file stores them."""
    folder = tiny_gpt_oss_mxfp4() if mxfp4 else tiny_gpt_oss()
    path = str(convert_hf_to_gguf(folder, "f32")["f32"])
    llm = LLM(path, dtype="float32", device="cpu", enable_prefix_caching=True, **STRESS)
    if mxfp4:
        assert "MXFP4" in (llm.stats().quantization or "")
    requests = batch()
    expected = [hf_greedy(hf_model(mxfp4), p, MAX_TOKENS) for p in requests]
    assert generate(llm, requests) == expected
    assert_engine_clean(llm)
