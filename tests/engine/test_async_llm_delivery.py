"""AsyncLLM's hand-over to asyncio: one wake-up per event loop per step, and a model loaded on the
stepping thread (so that one thread runs every OpenMP parallel region of the engine)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from backend.engine import AsyncLLM, SamplingParams
from backend.engine.config import EngineConfig
from backend.engine.load_phases import LoadPhases
from tests.engine_utils import assert_engine_clean, prompts, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class CountingLoop(asyncio.SelectorEventLoop):
    """A real event loop that counts the wake-ups other threads ask of it."""

    def __init__(self) -> None:
        super().__init__()
        self.threadsafe_calls = 0

    def call_soon_threadsafe(self, callback, *args, context=None):
        self.threadsafe_calls += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


def config() -> EngineConfig:
    return EngineConfig(tiny_model("llama")[0], dtype="float32", device="cpu", max_model_len=128)


def test_the_model_loads_on_the_stepping_thread_and_a_failed_load_raises():
    loaded_on: list[str] = []
    phases = LoadPhases(lambda name, fraction: loaded_on.append(threading.current_thread().name))
    engine = AsyncLLM.from_config(config(), phases)
    try:
        assert loaded_on and set(loaded_on) == {"AsyncLLM-engine"}
        assert not engine.errored
    finally:
        engine.shutdown()
    before = threading.active_count()
    with pytest.raises(Exception, match="not found"):
        AsyncLLM.from_config(EngineConfig("/nonexistent/model-folder", device="cpu"))
    assert threading.active_count() <= before  # the failed load left no stepping thread behind


def test_a_step_wakes_the_event_loop_once_for_all_its_requests():
    engine = AsyncLLM.from_config(config())
    batch = prompts(seed=7)[:6]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    async def stream(prompt):
        return [out async for out in engine.generate(prompt, params)]

    async def main():
        return await asyncio.gather(*(stream(p) for p in batch))

    loop = CountingLoop()
    try:
        steps_before = engine.stats().num_steps_total
        streams = loop.run_until_complete(main())
        steps = engine.stats().num_steps_total - steps_before
    finally:
        loop.close()
    try:
        outputs = sum(len(s) for s in streams)
        assert all(len(s[-1].outputs[0].token_ids) == 12 and s[-1].finished for s in streams)
        # one hand-over per step (plus none for adds): far fewer than one per output
        assert loop.threadsafe_calls <= steps
        assert outputs > 2 * loop.threadsafe_calls
        assert_engine_clean(engine.llm)
    finally:
        engine.shutdown()
