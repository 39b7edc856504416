"""The default model (SmolLM2-135M-Instruct, GGUF Q4_1) through the engine against transformers on the
same dequantized weights: identical greedy tokens in fp32; in bf16 (dense, and kept quantized) the first
differing token of each prompt is within the other side's top-5.

Parsing the GGUF file dominates this module's time, so it is read three times only: by transformers for
the reference (the session's `default_hf_model`, shared with other modules), and by the engine's GGUF
loader for the fp32 check and the bf16 run kept quantized. The
dense bf16 engine loads the reference's dequantized weights saved as safetensors (the same weights,
without another parse)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from backend.default_model import default_model
from backend.engine import LLM, SamplingParams
from tests.engine_utils import assert_engine_clean

pytestmark = pytest.mark.slow
MAX_TOKENS = 32
QUESTIONS = [
    "Hi!",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a KV cache is in one paragraph.",
    "List three prime numbers.",
    "Translate 'good morning' into German and Spanish.",
    "Why is the sky blue? Answer in detail, with the physics involved, for a curious ten-year-old.",
    "Summarise the plot of Hamlet. " * 6,
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, default_hf_model):
    """(prompts, transformers fp32 greedy tokens, their per-step log-probabilities, a model folder
    holding transformers' dequantized weights)."""
    model, tokenizer = default_hf_model  # the GGUF read by transformers in fp32, once per session
    prompts, tokens, logprobs = [], [], []
    for question in QUESTIONS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(text, add_special_tokens=False).input_ids
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([ids]),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=None,
                min_new_tokens=None,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
        prompts.append(ids)
        tokens.append(out.sequences[0, len(ids) :].tolist())
        logprobs.append([step[0].float().log_softmax(-1) for step in out.logits])
    folder = tmp_path_factory.mktemp("smollm2-dequantized")
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        del state["lm_head.weight"]  # the same tensor as the embedding
    save_file({name: t.contiguous() for name, t in state.items()}, folder / "model.safetensors")
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return prompts, tokens, logprobs, str(folder)


def engine_outputs(model: str, dtype: str, prompts: list[list[int]], logprobs: int | None = None):
    llm = LLM(model, dtype=dtype, max_model_len=1024, max_num_seqs=8)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=logprobs)
    outs = llm.generate(prompts, params)
    assert_engine_clean(llm)
    if model.endswith(".gguf"):
        assert llm.model_name == "SmolLM2-135M-Instruct"
        stats = llm.stats()  # kept at Q4_1 as stored (Q8_0 embedding): 96.5 MB, 270 MB dequantized
        assert stats.quantization == "gguf Q8_0 (1 tensor), Q4_1 (210 tensors)"
        assert stats.weights_bytes <= 110e6
    return [out.outputs[0] for out in outs]


def test_fp32_is_token_identical_to_transformers(reference):
    prompts, tokens, _, _ = reference
    assert len({len(p) for p in prompts}) >= 6  # varied lengths
    outs = engine_outputs(default_model(check_hub=False), "float32", prompts)
    assert [out.token_ids for out in outs] == tokens
    assert "Paris" in outs[1].text


@pytest.mark.parametrize("kept", [False, True], ids=["dequantized", "as-stored"])
def test_bf16_differs_only_among_top5_candidates(reference, kept):
    """The dense bf16 engine, and the GGUF file kept quantized in bf16 (the CPU's bf16 kernels over the
    Q4_1 and Q8_0 blocks, as the app runs the default model)."""
    prompts, tokens, ref_logprobs, folder = reference
    model = default_model(check_hub=False) if kept else folder
    outs = engine_outputs(model, "bfloat16", prompts, logprobs=5)
    identical = 0
    for out, ref, ref_lp in zip(outs, tokens, ref_logprobs, strict=True):
        mismatch = next((i for i, (a, b) in enumerate(zip(out.token_ids, ref, strict=True)) if a != b), None)
        if mismatch is None:
            identical += 1
            continue
        # after the first difference the two continuations have different contexts: compare there only
        ours, theirs = out.token_ids[mismatch], ref[mismatch]
        assert theirs in out.logprobs[mismatch], (
            f"transformers' token not in the engine's top-5 at {mismatch}"
        )
        assert ours in torch.topk(ref_lp[mismatch], 5).indices.tolist()
    # greedy continuations in bf16 diverge at near-ties (fp32 summation order differs from transformers');
    # the check that matters is the top-5 one above at every first difference. Measured on the 2-core
    # AVX512_BF16 EPYC: as stored 3 of 8 identical (bf16 dot-product kernels); dense 4 of 8 on oneDNN's
    # GEMM, 2 of 8 on gemm_bf16 (24 chat prompts: 13 and 12 of 24; the two GEMMs differ in 1e-4 of their
    # outputs by a bf16 unit, which is enough to move a near-tie).
    assert identical >= len(prompts) // 4
