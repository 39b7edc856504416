"""EngineHolder: a failed launch never takes down the serving engine; a relaunch swaps engines only once
the new one is ready, and the old one finishes the requests it holds before it shuts down."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

import pytest

from backend.engine import SamplingParams
from backend.engine.config import EngineConfig
from backend.engine.load_phases import LoadPhases
from backend.server.engine_holder import EngineHolder, build_engine
from tests.engine_utils import tiny_model
from tests.server_utils import wait_until
from ui import launch_tab

MIB = 1024**2


def config(model: str, **kw) -> EngineConfig:
    return EngineConfig(model=model, dtype="float32", device="cpu", kv_cache_memory_bytes=8 * MIB, **kw)


@pytest.fixture(scope="module")
def tiny() -> str:
    return tiny_model("llama")[0]


def generate(engine, max_tokens: int, ignore_eos: bool = True):
    async def run():
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
        outputs = [out async for out in engine.generate([5, 6, 7, 8], params)]
        return outputs[-1]

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (dict(model="/no/such/model"), "Model path not found"),
        (dict(kv_cache_memory_bytes=10**9 * MIB), "allocate"),  # 10^9 MiB
    ],
)
def test_a_failed_launch_leaves_the_running_engine_serving(tiny, bad, words):
    holder = EngineHolder()
    assert holder.launch(config(tiny)).state == "ready"
    engine = holder.get()
    status = holder.launch(replace(config(tiny), **bad))
    assert status.state == "ready" and words in status.error and status.serving.model == tiny
    assert holder.get() is engine
    assert generate(engine, 3).outputs[0].finish_reason == "length"  # still serving
    holder.shutdown()


def test_a_failed_first_launch_is_failed_and_the_form_says_so(tiny):
    holder = EngineHolder()
    message, status = launch_tab.launch_engine(holder, {**launch_form(tiny), "model": "/no/such/model"})
    assert "Launch failed" in message and "keeps serving" not in message and "data-state='failed'" in status
    assert holder.get() is None


def launch_form(tiny: str) -> dict:
    return {
        **launch_tab.form_defaults(),
        "model": tiny,
        "dtype": "float32",
        "device": "cpu",
        "block_size": 16,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 64,
        "max_model_len": 0,
        "num_kv_blocks": 0,
        "kv_cache_memory_bytes": 8,
        "enable_prefix_caching": True,
        "seed": 0,
        "trust_remote_code": False,
    }


def test_the_launch_form_reports_a_failed_relaunch_beside_the_serving_engine(tiny):
    holder = EngineHolder()
    assert "msg-ok" in launch_tab.launch_engine(holder, launch_form(tiny))[0]
    message, status = launch_tab.launch_engine(holder, {**launch_form(tiny), "model": "/no/such/model"})
    assert "Launch failed" in message and "llama keeps serving" in message  # by name, not its path
    assert tiny not in message
    assert "data-state='ready'" in status and "The last launch failed" in status
    holder.shutdown()


def test_the_old_engine_serves_while_the_new_one_loads_and_finishes_its_requests_after_the_swap(tiny):
    loading, release = threading.Event(), threading.Event()

    def slow_factory(cfg: EngineConfig, phases: LoadPhases):
        if cfg.max_num_seqs == 4:  # the relaunch: hold it in "loading" until the test says so
            loading.set()
            release.wait(60)
        return build_engine(cfg, phases)

    holder = EngineHolder(engine_factory=slow_factory, drain_timeout_s=60)
    holder.launch(config(tiny))
    old = holder.get()
    relaunch = threading.Thread(target=holder.launch, args=(config(tiny, max_num_seqs=4),))
    relaunch.start()
    loading.wait(30)
    status = holder.status()
    assert status.state == "loading" and status.serving.model == tiny and holder.get() is old
    assert generate(old, 2).outputs[0].finish_reason == "length"  # serving during the load

    result = {}
    long_request = threading.Thread(target=lambda: result.update(out=generate(old, 40)))
    long_request.start()
    wait_until(lambda: old.stats().num_requests_running == 1, what="the long request runs")
    release.set()
    relaunch.join(60)
    assert holder.get() is not old and holder.status().config.max_num_seqs == 4
    long_request.join(120)
    out = result["out"].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 40  # finished on the retired engine
    wait_until(lambda: old.stats().num_requests_running == 0, what="the old engine drained")
    assert generate(holder.get(), 2).outputs[0].finish_reason == "length"
    holder.shutdown()


class DeadEngineStub:
    """Stands in for an AsyncLLM whose stepping thread has stopped (AsyncLLM.errored)."""

    errored = True

    def shutdown(self) -> None:
        pass


def test_a_held_engine_that_died_shows_as_failed_not_ready(tiny):
    holder = EngineHolder(engine_factory=lambda cfg, phases: DeadEngineStub())
    status = holder.launch(config(tiny))
    assert status.state == "failed" and "internal error" in status.error and status.serving is None
    assert "data-state='failed'" in launch_tab.status_html(holder)
