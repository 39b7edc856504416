"""AsyncLLM: streaming, abort, consumers that go away, bad input that disturbs nothing, stats()."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from backend.engine import LLM, AsyncLLM, SamplingParams
from tests.engine_utils import (
    assert_engine_clean,
    hf_greedy,
    prompts,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread", "no_leaked_blocks")

ARCH = "qwen3"


@pytest.fixture(scope="module")
def engine():
    llm = LLM(tiny_model(ARCH)[0], dtype="float32", device="cpu", max_model_len=128)
    async_llm = AsyncLLM(llm)
    yield async_llm
    async_llm.shutdown()
    async_llm.shutdown()  # idempotent


async def collect(engine, prompt, params, request_id=None):
    return [out async for out in engine.generate(prompt, params, request_id=request_id)]


def test_streams_are_cumulative_and_match_offline_greedy(engine):
    batch = prompts(seed=20)

    async def main():
        params = SamplingParams(temperature=0.0, max_tokens=16)
        return await asyncio.gather(*(collect(engine, p, params) for p in batch))

    for prompt, stream in zip(batch, asyncio.run(main()), strict=True):
        assert [out.finished for out in stream] == [False] * (len(stream) - 1) + [True]
        ids = [out.outputs[0].token_ids for out in stream]
        texts = [out.outputs[0].text for out in stream]
        assert all(a == b[: len(a)] for a, b in itertools.pairwise(ids))
        assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
        # a random model emits stray byte tokens; text only grows past them once they are complete
        assert not any(text.endswith("\ufffd") for text in texts[:-1])
        assert texts[-1] == engine.tokenizer.decode(ids[-1], skip_special_tokens=True)
        assert ids[-1] == hf_greedy(ARCH, prompt, 16)
        metrics = stream[-1].metrics
        assert metrics.arrival_time <= metrics.first_scheduled_time <= metrics.first_token_time
        assert metrics.first_token_time <= metrics.last_token_time <= metrics.finished_time


def test_abort_ends_the_stream_and_frees_blocks(engine):
    async def main():
        seen, aborted = [], False
        async for out in engine.generate(prompts(seed=21)[5], SamplingParams(max_tokens=100), "to-abort"):
            seen.append(out)
            # outputs are cumulative and the collector keeps the newest: a busy consumer may never see
            # exactly 3 tokens, so abort once, at the first output with at least 3
            if len(out.outputs[0].token_ids) >= 3 and not aborted:
                engine.abort("to-abort")
                aborted = True
        return seen

    seen = asyncio.run(main())
    assert seen[-1].finished and seen[-1].outputs[0].finish_reason == "abort"
    assert len(seen[-1].outputs[0].token_ids) < 100


def test_a_consumer_that_stops_iterating_aborts_its_request(engine):
    async def main():
        agen = engine.generate(prompts(seed=22)[4], SamplingParams(max_tokens=100))
        async for out in agen:
            if len(out.outputs[0].token_ids) >= 2:
                break
        await agen.aclose()
        for _ in range(100):  # the stepping thread applies the abort within a step
            if engine.stats().num_kv_blocks_used == 0:
                break
            await asyncio.sleep(0.01)

    asyncio.run(main())
    stats = engine.stats()
    assert stats.num_requests_running == 0 and stats.num_kv_blocks_used == 0


def test_bad_requests_fail_fast_and_disturb_nothing(engine):
    prompt = prompts(seed=23)[3]

    async def bad(prompt, params):
        with pytest.raises(ValueError) as info:
            await collect(engine, prompt, params)
        return str(info.value)

    async def main():
        good = asyncio.ensure_future(collect(engine, prompt, SamplingParams(temperature=0.0, max_tokens=24)))
        await asyncio.sleep(0.05)
        messages = [
            await bad([5] * 200, SamplingParams()),
            await bad("", SamplingParams()),
            await bad([], SamplingParams()),
            await bad([10**9], SamplingParams()),
        ]
        return messages, await good

    messages, stream = asyncio.run(main())
    assert "200" in messages[0] and "128" in messages[0]
    assert "empty" in messages[1] and "empty" in messages[2]
    assert "[0, 49151]" in messages[3]
    assert stream[-1].outputs[0].token_ids == hf_greedy(ARCH, prompt, 24)


def test_stats_snapshot():
    llm = LLM(tiny_model(ARCH)[0], dtype="float32", device="cpu", max_model_len=128)
    core = llm.llm_engine
    core.add_request("watched", prompts(seed=24)[5], SamplingParams(max_tokens=50))
    core.add_request("queued", [5] * 120, SamplingParams(max_tokens=5))
    core.step(), core.step()  # both prompts fit the token budget: 2 prefills, then 2 decodes
    stats = llm.stats()
    json.dumps(stats.to_dict())  # the JSON edge
    expected = {
        "model", "device", "dtype", "block_size", "num_kv_blocks_total", "num_kv_blocks_used",
        "kv_cache_usage", "num_requests_running", "num_requests_waiting", "num_preemptions_total",
        "prefix_cache_queries_total", "prefix_cache_hits_total", "prompt_tokens_total",
        "generation_tokens_total", "num_requests_finished_total", "num_steps_total", "step_time_last_s",
        "step_time_mean_s", "weights_bytes", "kv_pool_bytes", "rss_bytes", "max_model_len", "max_num_seqs",
        "max_num_batched_tokens", "timestamp", "block_owners",
    }  # fmt: skip
    assert expected <= set(stats.to_dict())
    assert stats.model == ARCH and stats.dtype == "float32" and stats.device == "cpu"
    assert stats.num_requests_running == 2 and stats.num_requests_waiting == 0
    assert len(stats.block_owners["watched"]) == 5  # 71 computed tokens in blocks of 16
    assert stats.num_kv_blocks_used == 5 + len(stats.block_owners["queued"])
    assert stats.kv_cache_usage == pytest.approx(stats.num_kv_blocks_used / stats.num_kv_blocks_total)
    assert stats.weights_bytes > 0 and stats.kv_pool_bytes > 0 and stats.rss_bytes > 0
    assert stats.generation_tokens_total == 4 and stats.prompt_tokens_total == 70 + 120
    assert stats.num_steps_total == 2 and stats.step_time_mean_s > 0
    core.abort_request("watched"), core.abort_request("queued")
    assert_engine_clean(llm)
