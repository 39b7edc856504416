"""Prompt logprobs (SamplingParams.prompt_logprobs, vLLM's shape) and the full log-softmax rows
(return_prompt_logprobs_tensor) equal transformers' fp32 log-softmax within 1e-4: whole prompts,
chunked prefill, a prompt whose prefix is cached, preemption mid-prefill, n > 1 and the whole vocabulary."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from backend.engine import LLM, SamplingParams
from tests.engine_utils import assert_engine_clean, prompts, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARCH = "llama"
TOLERANCE = 1e-4
TOP = 5


@cache
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model(ARCH)[0])


def make_llm(**kwargs) -> LLM:
    return LLM(tiny_model(ARCH)[0], dtype="float32", device="cpu", **{"max_model_len": 256} | kwargs)


def reference(prompt: list[int]) -> torch.Tensor:
    """transformers' fp32 log-softmax rows of the prompt, [len(prompt), vocab]."""
    with torch.inference_mode():
        logits = tiny_model(ARCH)[1](torch.tensor([prompt])).logits[0]
    return logits.float().log_softmax(-1)


def params(**kwargs) -> SamplingParams:
    return SamplingParams(
        **{"temperature": 0.0, "max_tokens": 2, "prompt_logprobs": TOP, "return_prompt_logprobs_tensor": True}
        | kwargs
    )


def assert_matches_reference(out, prompt: list[int], top: int = TOP) -> None:
    ref = reference(prompt)
    assert out.prompt_logprobs_tensor is not None
    assert out.prompt_logprobs_tensor.shape == (len(prompt) - 1, ref.shape[1])
    assert torch.allclose(out.prompt_logprobs_tensor, ref[:-1], atol=TOLERANCE, rtol=0)
    entries = out.prompt_logprobs
    assert entries is not None and len(entries) == len(prompt) and entries[0] is None
    for position, (token_id, entry) in enumerate(zip(prompt[1:], entries[1:], strict=True)):
        row = ref[position]
        for tid, lp in entry.items():  # the prompt token and the top ones: values and ranks
            assert lp.logprob == pytest.approx(float(row[tid]), abs=TOLERANCE)
            above = int((row > row[tid] + TOLERANCE).sum()) + 1
            assert above <= lp.rank <= int((row > row[tid] - TOLERANCE).sum()) + 1
        others = [lp.rank for tid, lp in entry.items() if tid != token_id]
        assert len(entry) in (top, top + 1) and sorted(others) == [
            rank for rank in range(1, top + 1) if rank != entry[token_id].rank or len(entry) == top + 1
        ]
    decoded = [entries[i][token_id].decoded_token for i, token_id in enumerate(prompt) if i]
    assert decoded == [tokenizer().decode([token_id]) for token_id in prompt[1:]]


@pytest.mark.parametrize(
    "engine_kwargs",
    [{}, dict(max_num_batched_tokens=16), dict(max_num_batched_tokens=7, block_size=4)],
    ids=["whole-prompt", "chunked-16", "chunked-7"],
)
def test_prompt_logprobs_match_transformers(engine_kwargs):
    llm = make_llm(**engine_kwargs)
    batch = prompts((1, 5, 17, 70), seed=12)
    outs = llm.generate(batch, params())
    for out, prompt in zip(outs, batch, strict=True):
        assert_matches_reference(out, prompt)
        assert out.outputs[0].token_ids  # and it still generates
    assert_engine_clean(llm)


def test_a_prompt_whose_prefix_is_cached_keeps_every_logprob():
    """vLLM v1's rule: a request with prompt logprobs reads no prefix-cache hits (a cached block holds
    KV, not logits), so its prompt is computed again and no position is missing; the blocks it computes
    are still cached for others."""
    llm = make_llm()
    prompt = prompts((70,), seed=13)[0]
    llm.generate(prompt, SamplingParams(max_tokens=1))  # caches the prompt's 4 full blocks
    hits = llm.stats().prefix_cache_hits_total
    longer = prompt + prompts((9,), seed=14)[0]
    for ids in (prompt, longer):
        assert_matches_reference(llm.generate(ids, params())[0], ids)
    assert llm.stats().prefix_cache_hits_total == hits
    llm.generate(longer, SamplingParams(max_tokens=1))  # a plain request still hits the cache
    assert llm.stats().prefix_cache_hits_total > hits
    assert_engine_clean(llm)


def test_preemption_mid_prefill_neither_doubles_nor_loses_an_entry():
    """Blocks of 4 tokens, 24 of them, 8-token chunks: four 40-token prompts prefill in turn while
    earlier ones decode and take blocks, so a prefilling sequence is preempted and recomputed from 0."""
    llm = make_llm(block_size=4, num_kv_blocks=24, max_model_len=96, max_num_batched_tokens=8)
    scheduler = llm.llm_engine.scheduler
    preempted_mid_prefill = []
    preempt = scheduler._preempt

    def recording_preempt(seq):
        state = seq.prompt_logprobs
        if state is not None and state.num_positions > 0 and not state.is_complete:
            preempted_mid_prefill.append(state.num_positions)
        preempt(seq)

    scheduler._preempt = recording_preempt
    batch = prompts((40, 40, 40, 40), seed=15)
    outs = llm.generate(batch, params(max_tokens=40, ignore_eos=True))
    assert preempted_mid_prefill, "the test did not preempt a sequence in the middle of its prefill"
    for out, prompt in zip(outs, batch, strict=True):
        assert_matches_reference(out, prompt)
    assert_engine_clean(llm)


def test_n_samples_share_one_prefill_and_one_set_of_prompt_logprobs():
    llm = make_llm()
    prompt = prompts((23,), seed=16)[0]
    out = llm.generate(prompt, params(n=3, temperature=1.0, seed=3, max_tokens=4))[0]
    assert len(out.outputs) == 3
    assert_matches_reference(out, prompt)
    assert_engine_clean(llm)


def test_the_whole_vocabulary_and_the_tensor_alone():
    llm = make_llm()
    prompt = prompts((4,), seed=17)[0]
    out = llm.generate(prompt, params(prompt_logprobs=-1, return_prompt_logprobs_tensor=False))[0]
    ref = reference(prompt)
    assert out.prompt_logprobs_tensor is None
    for position, entry in enumerate(out.prompt_logprobs[1:]):
        assert len(entry) == ref.shape[1]
        values = torch.tensor([entry[tid].logprob for tid in range(ref.shape[1])])
        assert torch.allclose(values, ref[position], atol=TOLERANCE, rtol=0)
        ranks = sorted(lp.rank for tid, lp in entry.items() if tid != prompt[position + 1])
        assert ranks[0] >= 1 and len(set(ranks)) == len(ranks)
    tensor_only = llm.generate(prompt, params(prompt_logprobs=None))[0]
    assert tensor_only.prompt_logprobs is None
    assert torch.allclose(tensor_only.prompt_logprobs_tensor, ref[:-1], atol=TOLERANCE, rtol=0)
    plain = llm.generate(prompt, SamplingParams(max_tokens=1))[0]
    assert plain.prompt_logprobs is None and plain.prompt_logprobs_tensor is None
    assert_engine_clean(llm)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(prompt_logprobs=-2), "prompt_logprobs must be None, -1"),
        (dict(prompt_logprobs=1.5), "prompt_logprobs"),
        (dict(return_prompt_logprobs_tensor=1), "return_prompt_logprobs_tensor"),
    ],
)
def test_invalid_prompt_logprobs_say_what_is_allowed(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)
