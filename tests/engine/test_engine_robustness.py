"""The engine survives anything a request can carry: a failure inside a step fails only its request, a
stepping thread that dies fails everyone at once (no hang), admission counts requests not yet in the
engine, and a consumer that stops reading holds one output, not a queue."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest

from backend.engine import LLM, AsyncLLM, SamplingParams
from backend.engine.exceptions import EngineDeadError, EngineOverloadedError
from backend.engine.fault_injection import ENV_VAR
from backend.server import build_app
from tests.engine_utils import (
    assert_engine_clean,
    prompts,
    tiny_model,
)
from tests.server_utils import RunningServer, long_context_tiny_model, wait_until

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(temperature=math.nan), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(repetition_penalty=math.inf), "repetition_penalty"),
        (dict(frequency_penalty=math.nan), "frequency_penalty"),
        (dict(min_p=math.nan), "min_p"),
        (dict(seed=2**64), "seed must be None or an integer in"),
        (dict(seed=1.5), "seed"),
        (dict(stop=["x"] * 65), "at most 64 strings, got 65"),
        (dict(stop="y" * 257), "at most 256 characters"),
        (dict(stop_token_ids=list(range(2000))), "stop_token_ids"),
        (dict(max_tokens=True), "max_tokens"),
    ],
)
def test_sampling_params_refuse_values_outside_their_domain(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


def test_a_tiny_temperature_is_raised_to_a_safe_one_as_in_vllm():
    assert SamplingParams(temperature=1e-300).temperature == 0.01
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)


@pytest.mark.parametrize("phase", ["sample", "execute"])
def test_an_injected_failure_fails_only_the_requests_it_touches(monkeypatch, phase):
    """Offline batch of three prompts; one carries the marker. Sampling failures are pinned on that one
    request; a failure of the shared forward pass fails the batch of that step and nothing else."""
    model = tiny_model("llama")[0]
    reference = LLM(model, dtype="float32", device="cpu").generate(prompts()[:3], GREEDY)
    monkeypatch.setenv(ENV_VAR, f"{phase}:MARKER")
    llm = LLM(model, dtype="float32", device="cpu")
    marked = llm.tokenizer("hello MARKER there").input_ids
    outs = llm.generate([*prompts()[:2], marked], GREEDY)
    assert outs[2].outputs[0].finish_reason == "error" and "InjectedFault" in outs[2].error
    assert_engine_clean(llm)
    if phase == "sample":  # the others ran in the same steps and are untouched
        assert [o.outputs[0].token_ids for o in outs[:2]] == [o.outputs[0].token_ids for o in reference[:2]]
    else:  # the first step prefilled all three together: all three failed, and the engine goes on
        assert all(o.outputs[0].finish_reason == "error" for o in outs)
    again = llm.generate(prompts()[:3], GREEDY)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in reference]


def test_a_dead_stepping_thread_fails_waiting_and_new_requests_at_once():
    engine = AsyncLLM(LLM(tiny_model("llama")[0], dtype="float32", device="cpu"))
    server = RunningServer(build_app(lambda: engine))

    def broken(*_args):
        raise RuntimeError("simulated bug in the engine")

    async def main():
        stream = engine.generate(prompts()[3], SamplingParams(max_tokens=400, ignore_eos=True))
        await anext(stream)
        engine.engine.step = broken  # the step fails, and so does the clean-up after it
        engine.engine.abort_request = broken
        with pytest.raises(EngineDeadError, match="simulated bug"):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await anext(engine.generate(prompts()[1]))

    try:
        asyncio.run(main())
        assert engine.errored
        assert httpx.get(f"{server.url}/health").status_code == 503
        resp = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi"})
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_dead"
        assert "Retry-After" in resp.headers
    finally:
        server.stop()
        engine.shutdown()


def test_admission_counts_requests_accepted_but_not_yet_in_the_engine():
    """400 requests admitted in one go (no await between them): the stepping thread has had no chance to
    add them, yet only the limit is accepted (plus the one that may already run: max_num_seqs=1)."""
    engine = AsyncLLM(
        LLM(long_context_tiny_model(), dtype="float32", device="cpu", max_num_seqs=1, max_model_len=8192),
        max_waiting_requests=256,
    )
    params = SamplingParams(max_tokens=8000, ignore_eos=True)

    async def main():
        accepted, refused = [], 0
        for i in range(400):
            try:
                accepted.append((f"burst-{i}", engine.add_request(f"burst-{i}", [5, 6, 7], params)))
            except EngineOverloadedError as exc:
                refused += 1
                assert "the limit is 256" in str(exc)
        assert 256 <= len(accepted) <= 257 and len(accepted) + refused == 400
        assert engine.stats().num_requests_waiting >= 255
        for request_id, _ in accepted:
            engine.abort(request_id)
        for request_id, collector in accepted:  # every stream ends, with "abort"
            last = await collector.get()
            assert last.finished and last.outputs[0].finish_reason == "abort", request_id

    try:
        asyncio.run(main())
        wait_until(lambda: engine.stats().num_kv_blocks_used == 0, what="all blocks freed")
        assert engine.stats().num_requests_waiting == 0
    finally:
        engine.shutdown()


def test_a_reader_that_stops_reading_holds_only_the_newest_output():
    engine = AsyncLLM(LLM(tiny_model("llama")[0], dtype="float32", device="cpu"))
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def main():
        collector = engine.add_request("slow-reader", prompts()[2], params)
        wait_until(lambda: engine.stats().num_requests_finished_total == 1, what="the request to end unread")
        first = await collector.get()  # 200 steps happened; the reader sees one, cumulative output
        assert first.finished and len(first.outputs[0].token_ids) == 200

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
