"""The monitoring adapter following our live server's /metrics (tiny random model), and the same sample
shape from the in-process engine's stats()."""

from __future__ import annotations

import openai
import pytest

from backend.monitor.samples import SAMPLE_KEYS, MetricsPoller, sample_from_stats
from backend.server import build_app
from tests.engine_utils import tiny_model
from tests.server_utils import RunningServer, start_engine, wait_until


@pytest.fixture(scope="module")
def served():
    engine = start_engine(tiny_model("llama")[0], num_kv_blocks=128, max_model_len=512)
    server = RunningServer(build_app(lambda: engine, served_model_name="tiny"))
    yield engine, server
    server.stop()
    engine.shutdown()


def test_poller_follows_our_server(served):
    engine, server = served
    poller = MetricsPoller(f"{server.url}/v1")
    first = poller.poll()
    assert first["engine"] == "embedded" and first.get("error") is None
    assert first["num_kv_blocks_total"] == 128 and first["num_kv_blocks_used"] == 0
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    generated = 0
    for i in range(4):
        reply = client.completions.create(
            model="tiny", prompt=f"number {i}", max_tokens=9, extra_body={"ignore_eos": True}
        )
        generated += reply.usage.completion_tokens
    wait_until(lambda: engine.stats().num_requests_running == 0, what="idle")
    second = poller.poll()
    elapsed = second["timestamp"] - first["timestamp"]
    assert second["generation_tokens_per_s"] == pytest.approx(generated / elapsed, rel=1e-6)
    assert second["prompt_tokens_per_s"] > 0
    assert 0 < second["ttft_p50_s"] <= second["ttft_p99_s"]
    assert 0 < second["itl_p50_s"] <= second["itl_p99_s"]
    assert second["num_requests_running"] == 0 and second["kv_cache_usage"] == 0
    assert second["prefix_cache_hit_rate"] is not None


def test_sample_from_stats_has_the_same_shape(served):
    engine, server = served
    before = engine.stats()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    client.completions.create(model="tiny", prompt="hello", max_tokens=5, extra_body={"ignore_eos": True})
    after = engine.stats()
    sample = sample_from_stats(after, before)
    assert set(SAMPLE_KEYS) <= set(sample) and sample["engine"] == "embedded"
    dt = after.timestamp - before.timestamp
    assert sample["generation_tokens_per_s"] == pytest.approx(5 / dt)
    assert sample["num_kv_blocks_total"] == 128
    again = sample_from_stats(engine.stats(), sample)  # a previous sample works as well as previous stats
    assert again["generation_tokens_per_s"] == 0.0
    assert sample_from_stats(after, None)["generation_tokens_per_s"] is None
