"""Parallel sampling, SamplingParams(n): the prompt is prefilled once, its KV blocks are shared by the n
samples (reference counts) and copied on the first write into the shared partial block; sample i of a
seeded request equals the request run alone with seed + i (vLLM v1's child seeds); aborts, preemption
and failures free every block."""

from __future__ import annotations

import pytest

from backend.engine import LLM, SamplingParams
from backend.engine.fault_injection import ENV_VAR
from backend.engine.sequence import SequenceStatus
from tests.engine_utils import assert_engine_clean, hf_greedy, prompts, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARCH = "llama"


def make_llm(**kwargs) -> LLM:
    return LLM(tiny_model(ARCH)[0], dtype="float32", device="cpu", **{"max_model_len": 256} | kwargs)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return make_llm()


def sampled(seed: int, n: int = 1, max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(n=n, temperature=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True)


def alone(llm: LLM, prompt: list[int], seed: int, max_tokens: int = 12) -> list[int]:
    return llm.generate(prompt, sampled(seed, max_tokens=max_tokens))[0].outputs[0].token_ids


@pytest.mark.parametrize(
    "engine_kwargs",
    [{}, dict(enable_prefix_caching=False), dict(max_num_batched_tokens=16), dict(block_size=4)],
    ids=["default", "no-prefix-cache", "chunked-prefill", "block-4"],
)
@pytest.mark.parametrize("length", [17, 32], ids=["partial-last-block", "full-blocks"])
def test_sample_i_equals_the_request_alone_with_seed_plus_i(engine_kwargs, length):
    """Copy-on-write correctness: a sample that wrote its KV into a block its siblings still read would
    change their continuations."""
    llm = make_llm(**engine_kwargs)
    prompt = prompts((length,), seed=3)[0]
    out = llm.generate(prompt, sampled(seed=11, n=4))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert [c.token_ids for c in out.outputs] == [alone(llm, prompt, 11 + i) for i in range(4)]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 4
    again = llm.generate(prompt, sampled(seed=11, n=4))[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
    assert_engine_clean(llm)


def test_greedy_samples_all_equal_transformers(llm):
    prompt = prompts((21,), seed=4)[0]
    out = llm.generate(prompt, SamplingParams(n=3, temperature=0.0, max_tokens=16))[0]
    reference = hf_greedy(ARCH, prompt, 16)
    assert [c.token_ids for c in out.outputs] == [reference] * 3
    assert_engine_clean(llm)


def test_the_prompt_is_prefilled_once_and_its_blocks_shared(llm):
    """37 tokens in blocks of 16: 3 blocks, the last partly filled. Step 1 prefills 37 tokens once and
    all 4 samples hold the 3 blocks; step 2 (4 decode tokens) copies the partial block for 3 of them."""
    engine = llm.llm_engine
    scheduled_tokens: list[int] = []
    execute = engine.runner.execute

    def counting_execute(scheduled):
        scheduled_tokens.append(sum(item.num_new_tokens for item in scheduled))
        return execute(scheduled)

    engine.runner.execute = counting_execute
    try:
        engine.add_request("shared", prompts((37,), seed=5)[0], sampled(seed=1, n=4, max_tokens=8))
        engine.step()
        blocks = engine.requests["shared"].seqs[0].block_table
        assert scheduled_tokens == [37] and len(blocks) == 3
        assert engine.block_manager.num_used_blocks == 3
        assert llm.stats().shared_blocks == {block: 4 for block in blocks}
        assert all(seq.block_table == blocks for seq in engine.requests["shared"].seqs)
        engine.step()
        assert scheduled_tokens == [37, 4]  # every sample's token counts against the budget
        assert engine.block_manager.num_used_blocks == 3 + 3
        assert llm.stats().shared_blocks == {block: 4 for block in blocks[:2]}
        assert len(llm.stats().block_owners["shared"]) == 6
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        engine.runner.execute = execute
    assert_engine_clean(llm)


@pytest.mark.parametrize("when", ["mid-prefill", "after-fork"])
def test_abort_frees_every_sample_and_block(when):
    llm = make_llm(max_num_batched_tokens=16)
    engine = llm.llm_engine
    engine.add_request("gone", prompts((40,), seed=6)[0], sampled(seed=2, n=4, max_tokens=50))
    engine.step()  # 16 of 40 prompt tokens
    seqs = engine.requests["gone"].seqs
    assert [seq.status for seq in seqs[1:]] == [SequenceStatus.WAITING_FOR_FORK] * 3
    if when == "after-fork":
        for _ in range(4):
            engine.step()
        assert all(seq.num_output_tokens > 0 for seq in seqs)
    out = engine.abort_request("gone")
    assert out is not None and out.finished
    assert [c.finish_reason for c in out.outputs] == ["abort"] * 4
    assert_engine_clean(llm)


def test_preempting_one_sample_keeps_every_output_and_leaks_nothing():
    """A pool of 12 blocks of 4 tokens: 4 samples of a 15-token prompt growing to 27 tokens each outgrow
    it, so samples are preempted and recomputed; each still equals its seed run alone."""
    llm = make_llm(block_size=4, num_kv_blocks=12, max_model_len=48)
    prompt = prompts((15,), seed=7)[0]
    out = llm.generate(prompt, sampled(seed=21, n=4))[0]
    assert llm.stats().num_preemptions_total > 0
    assert [c.token_ids for c in out.outputs] == [alone(llm, prompt, 21 + i) for i in range(4)]
    assert_engine_clean(llm)


def test_more_samples_than_max_num_seqs():
    llm = make_llm(max_num_seqs=2)
    prompt = prompts((19,), seed=8)[0]
    out = llm.generate(prompt, sampled(seed=30, n=5, max_tokens=6))[0]
    assert [c.token_ids for c in out.outputs] == [alone(llm, prompt, 30 + i, 6) for i in range(5)]
    assert_engine_clean(llm)


def test_samples_and_other_requests_in_one_batch(llm):
    batch = prompts((9, 33, 17), seed=9)
    params = [sampled(seed=40, n=3), SamplingParams(temperature=0.0, max_tokens=12), sampled(seed=50, n=2)]
    outs = llm.generate(batch, params)
    assert [c.token_ids for c in outs[0].outputs] == [alone(llm, batch[0], 40 + i) for i in range(3)]
    assert outs[1].outputs[0].token_ids == hf_greedy(ARCH, batch[1], 12)
    assert [c.token_ids for c in outs[2].outputs] == [alone(llm, batch[2], 50 + i) for i in range(2)]
    assert_engine_clean(llm)


def test_a_failing_sample_fails_its_request_and_frees_its_blocks(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "sample:FAILME")
    llm = make_llm()
    bad = llm.tokenizer("FAILME please").input_ids
    good = prompts((20,), seed=10)[0]
    outs = llm.generate([bad, good], [sampled(seed=1, n=4), SamplingParams(temperature=0.0, max_tokens=8)])
    assert [c.finish_reason for c in outs[0].outputs] == ["error"] * 4
    assert outs[1].outputs[0].token_ids == hf_greedy(ARCH, good, 8)
    assert_engine_clean(llm)
