"""Greedy outputs of the engine are token-identical to transformers `generate` in fp32, on tiny random
models of every supported architecture: one at a time, staggered, chunked prefill, prefix caching on/off,
and under preemption. After every test the engine holds no KV block."""

from __future__ import annotations

import pytest

from backend.engine import LLM, SamplingParams
from tests.engine_utils import (
    ARCHITECTURES,
    assert_engine_clean,
    hf_greedy,
    prompts,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread", "no_leaked_blocks")

MAX_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
LEAK_CHECKED: list[LLM] = []  # every engine built here (no_leaked_blocks checks them)


def make_llm(arch: str, **kwargs) -> LLM:
    llm = LLM(tiny_model(arch)[0], dtype="float32", device="cpu", **kwargs)
    LEAK_CHECKED.append(llm)
    return llm


@pytest.fixture(scope="module")
def engines() -> dict[str, LLM]:
    return {arch: make_llm(arch) for arch in ARCHITECTURES}


def token_ids(outputs) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in outputs]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_one_request_at_a_time(engines, arch):
    llm = engines[arch]
    for prompt in prompts():
        (out,) = llm.generate(prompt, GREEDY)
        assert out.prompt_token_ids == prompt
        assert out.outputs[0].token_ids == hf_greedy(arch, prompt, MAX_TOKENS)
        assert out.finished and out.outputs[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_many_at_once_with_staggered_arrival(engines, arch):
    engine = engines[arch].llm_engine
    batch = prompts(seed=1) + prompts(lengths=(9, 40, 3), seed=2)
    max_tokens = [MAX_TOKENS - (i % 4) * 5 for i in range(len(batch))]
    pending = list(enumerate(batch))
    results = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        if pending and step % 3 == 0:  # a new request every third step, while others decode
            i, prompt = pending.pop(0)
            engine.add_request(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens[i]))
        for out in engine.step():
            if out.finished:
                results[int(out.request_id)] = out.outputs[0].token_ids
        step += 1
    assert len(results) == len(batch)
    for i, prompt in enumerate(batch):
        assert results[i] == hf_greedy(arch, prompt, max_tokens[i]), f"request {i} (prompt {len(prompt)})"


@pytest.mark.parametrize("budget", [1, 4, 16, 4096])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "granite", "olmo2", "phi4_mini", "smollm3", "gemma3"])
def test_chunked_prefill_token_budgets(arch, budget):
    llm = make_llm(arch, max_num_batched_tokens=budget)
    batch = prompts(seed=3)
    outs = llm.generate(batch, GREEDY)
    assert token_ids(outs) == [hf_greedy(arch, p, MAX_TOKENS) for p in batch]
    stats = llm.stats()
    if budget < max(map(len, batch)):
        # a prompt longer than the budget took several steps: more steps than generated tokens per request
        assert stats.num_steps_total > MAX_TOKENS + max(map(len, batch)) // budget - 1
    LEAK_CHECKED.remove(llm)
    assert_engine_clean(llm)


@pytest.mark.parametrize(
    ("arch", "enable_prefix_caching"),
    [
        ("qwen2", True),
        ("qwen2", False),
        ("granite", True),
        ("olmo2", True),
        ("phi3", True),
        ("smollm3", True),
        ("gemma3", True),
    ],
)
def test_prefix_caching_on_and_off(arch, enable_prefix_caching):
    llm = make_llm(arch, enable_prefix_caching=enable_prefix_caching)
    shared = prompts(lengths=(40,), seed=4)[0]
    batch = [shared + tail for tail in prompts(lengths=(3, 8, 20), seed=5)] + [shared]
    first = llm.generate(batch, GREEDY)
    expected = [hf_greedy(arch, p, MAX_TOKENS) for p in batch]
    assert token_ids(first) == expected
    hits_after_first = llm.stats().prefix_cache_hits_total
    second = llm.generate(batch, GREEDY)  # every prompt's full blocks are now cached
    assert token_ids(second) == expected
    stats = llm.stats()
    if enable_prefix_caching:
        assert stats.prefix_cache_hits_total - hits_after_first >= len(batch) * 32
        assert stats.prefix_cache_queries_total >= 2 * sum(map(len, batch))
    else:
        assert stats.prefix_cache_hits_total == 0
    LEAK_CHECKED.remove(llm)
    assert_engine_clean(llm)


def test_forced_prefix_cache_hash_collision_never_serves_another_prompts_kv(monkeypatch):
    """Every block hashes alike (a forced collision): a hit still needs the same tokens and parent, so
    each prompt gets its own KV and the output matches transformers; the one true shared block hits."""
    monkeypatch.setattr("backend.engine.block_manager.hash_block_tokens", lambda parent, tokens: b"same")
    arch = "qwen2"
    llm = make_llm(arch)
    shared = prompts(lengths=(16,), seed=7)[0]  # exactly one block in common
    batch = [shared + tail for tail in prompts(lengths=(30, 45), seed=8)] + prompts(lengths=(50,), seed=9)
    expected = [hf_greedy(arch, p, MAX_TOKENS) for p in batch]
    for prompt, want in zip(batch, expected, strict=True):  # one at a time: each sees the others' cache
        assert token_ids(llm.generate(prompt, GREEDY)) == [want]
    assert token_ids(llm.generate(batch, GREEDY)) == expected
    assert llm.stats().prefix_cache_hits_total >= 16
    LEAK_CHECKED.remove(llm)
    assert_engine_clean(llm)


@pytest.mark.parametrize("arch", ["llama", "mistral", "olmo2", "phi4_mini", "smollm3", "gemma3"])
def test_preemption_when_the_kv_pool_is_small(arch):
    llm = make_llm(arch, block_size=4, num_kv_blocks=30, max_num_seqs=8)
    batch = prompts(seed=6)
    outs = llm.generate(batch, GREEDY)
    assert llm.stats().num_preemptions_total > 0
    assert token_ids(outs) == [hf_greedy(arch, p, MAX_TOKENS) for p in batch]
    LEAK_CHECKED.remove(llm)
    assert_engine_clean(llm)


@pytest.mark.parametrize(("max_model_len", "lengths"), [(64, (5, 30, 40)), (512, (65, 100))])
def test_longrope_factors_follow_max_model_len(max_model_len, lengths):
    """Phi-4-mini's LongRoPE (original context 64 of 512): within the original context the short factors,
    past it the long ones, fixed per engine by max_model_len (vLLM's rule); transformers picks them per
    forward pass, which is the same for sequences within 64 tokens and for prompts longer than 64."""
    llm = make_llm("phi4_mini_long", max_model_len=max_model_len, max_num_batched_tokens=32)
    batch = prompts(lengths=lengths, seed=10)
    assert token_ids(llm.generate(batch, GREEDY)) == [
        hf_greedy("phi4_mini_long", p, MAX_TOKENS) for p in batch
    ]
    LEAK_CHECKED.remove(llm)
    assert_engine_clean(llm)
