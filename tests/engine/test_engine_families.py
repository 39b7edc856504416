"""Each dense family's tiny model (tests/gguf_family_utils.py, random norms included) through the engine
from its safetensors and from the GGUF files llama.cpp's own converter writes of it: greedy tokens equal
transformers' fp32 ones from the safetensors and from the F32 file, with chunked prefill, prefix caching
(the batch run twice: the second run hits) and preemption (a small KV pool) on; from the converter's Q8_0
file, where each continuation first differs from the F32 file's, each side's token is among the other's
top 5. Prompts pass the families' sliding windows (16 tokens: Gemma 3's local layers). After every run
the engine holds no block."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from backend.engine import LLM, SamplingParams
from tests.engine_utils import assert_engine_clean, count_identical_within_top5, hf_greedy, prompts
from tests.gguf_family_utils import family_gguf, tiny_family_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DENSE_FAMILIES = (
    "llama",
    "mistral",
    "qwen3",
    "granite",
    "olmo2",
    "phi3",
    "phi3-longrope",
    "smollm3",
    "gemma3",
)
MAX_TOKENS = 20
# chunks of 8 tokens, 4-token blocks, a pool of 40 blocks for 5 sequences of up to 60 + 20 tokens: prompts
# take several steps and running sequences are preempted; phi3-longrope's original context is 256 (its
# short factors), so max_model_len stays within it
ENGINE = dict(
    dtype="float32",
    device="cpu",
    block_size=4,
    num_kv_blocks=40,
    max_num_batched_tokens=8,
    max_num_seqs=5,
    max_model_len=160,
    enable_prefix_caching=True,
)


def batch() -> list[list[int]]:
    shared = prompts(lengths=(24,), seed=11, vocab=2048)[0]  # six blocks every prompt but the last shares
    return [shared + tail for tail in prompts(lengths=(1, 9, 20, 36), seed=12, vocab=2048)] + [shared[:5]]


@cache
def reference(family: str) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_family_model(family), dtype=torch.float32).eval()
    return [hf_greedy(model, prompt, MAX_TOKENS) for prompt in batch()]


def run_twice(model: str, logprobs: int | None = None) -> tuple[list, LLM]:
    """The batch's completions (second run's) from an engine on model; both runs must agree."""
    llm = LLM(model, **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=logprobs)
    first = [out.outputs[0] for out in llm.generate(batch(), params)]
    second = [out.outputs[0] for out in llm.generate(batch(), params)]
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    stats = llm.stats()
    assert stats.num_preemptions_total > 0
    assert stats.prefix_cache_hits_total >= 24  # the shared blocks served again, at least once
    assert_engine_clean(llm)
    return second, llm


@pytest.mark.parametrize("source", ["safetensors", "f32"])
@pytest.mark.parametrize("family", DENSE_FAMILIES)
def test_greedy_tokens_equal_transformers(family, source):
    model = tiny_family_model(family) if source == "safetensors" else str(family_gguf(family, source))
    completions, llm = run_twice(model)
    assert [c.token_ids for c in completions] == reference(family)
    if source == "f32":
        assert llm.llm_engine.quantization is None or "Q" not in llm.llm_engine.quantization


@pytest.mark.parametrize("family", DENSE_FAMILIES)
def test_q8_0_file_runs_within_top5_of_f32(family):
    quantized, llm = run_twice(str(family_gguf(family, "q8_0")), logprobs=5)
    assert "Q8_0" in (llm.llm_engine.quantization or "")
    dense, _ = run_twice(str(family_gguf(family, "f32")), logprobs=5)
    identical = count_identical_within_top5(quantized, dense)
    print(f"{family} Q8_0: {identical} of {len(dense)} continuations identical to F32")


@pytest.mark.parametrize("source", ["safetensors", "f32", "q8_0"])
def test_gemma3_within_its_sliding_window(source):
    """Gemma 3 at a context of exactly its 16-token window (the battery above runs past it):
    4-token chunks and blocks, a pool of 8 blocks for
    three sequences (preemption), a shared first block (prefix caching). F32 and safetensors token-exact;
    Q8_0 within the F32 file's top 5 where it first differs."""
    family, max_tokens = "gemma3", 8
    shared = prompts(lengths=(4,), seed=13, vocab=2048)[0]
    batch = [shared + tail for tail in prompts(lengths=(1, 3, 4), seed=14, vocab=2048)]
    engine = ENGINE | dict(max_model_len=16, num_kv_blocks=8, max_num_batched_tokens=4, max_num_seqs=3)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=5)

    def run(model: str) -> list:
        llm = LLM(model, **engine)
        outs = [o.outputs[0] for o in llm.generate(batch, params) + llm.generate(batch, params)]
        assert llm.stats().num_preemptions_total > 0 and llm.stats().prefix_cache_hits_total >= 4
        assert_engine_clean(llm)
        return outs[len(batch) :]

    model = tiny_family_model(family) if source == "safetensors" else str(family_gguf(family, source))
    ours = run(model)
    if source == "q8_0":
        count_identical_within_top5(ours, run(str(family_gguf(family, "f32"))))
        return
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_family_model(family), dtype=torch.float32).eval()
    assert [c.token_ids for c in ours] == [hf_greedy(reference, p, max_tokens) for p in batch]
