"""Real vLLM (CPU build, .venv-vllm from `make vllm`) launched through the Launch tab's code path
(backend.export.supervisor: the exported `vllm serve` command as a managed child process): chat through the
`openai` client, its /metrics read into the monitor's normalised samples, and a stop that leaves no process.
vLLM starts once for the module (a minute or more on a shared CPU)."""

from __future__ import annotations

import psutil
import pytest

from backend.export.supervisor import ExternalServers, installed
from backend.monitor.samples import MetricsPoller
from backend.planner.request import PlanRequest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
START_TIMEOUT_S = 1800  # vLLM compiles at its first start with a new config; the machine is shared


def vllm_plan(model: str) -> PlanRequest:
    return PlanRequest(
        model=model,
        gpu="CPU",
        engine="vllm",
        quant="fp32",
        max_model_len=2048,
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        block_size=32,  # vLLM's CPU attention needs a multiple of 32
    )


@pytest.fixture(scope="module")
def vllm_server(default_dense_model):
    if not installed("vllm"):
        pytest.fail("vLLM is not installed: run `make vllm` (make test does)")
    servers = ExternalServers()
    server = servers.start(vllm_plan(str(default_dense_model)), "vllm")
    status = server.wait_ready(START_TIMEOUT_S)
    if status.state != "ready":
        servers.stop_all()
        pytest.fail(f"vLLM did not start ({status.state}, {status.phase}):\n" + "\n".join(server.log)[-4000:])
    yield servers, server
    servers.stop_all()


def test_vllm_starts_through_the_launch_path_with_phases_and_kv_size(vllm_server):
    servers, server = vllm_server
    status = server.status()
    assert status.state == "ready" and status.progress == 1.0
    assert status.base_url == f"http://127.0.0.1:{server.port}/v1"
    assert server.command.startswith("vllm serve ") and f"--port {server.port}" in server.command
    assert server.startup.phase in ("engine ready, starting the API", "API server starting")
    assert server.startup.kv_cache_tokens > 1000  # "KV cache size: N tokens" from vLLM's own log
    assert servers.ready() is server


def test_chat_through_the_openai_client_answers(vllm_server):
    from openai import OpenAI

    _, server = vllm_server
    client = OpenAI(base_url=server.base_url, api_key="unused")
    reply = client.chat.completions.create(
        model=server.served_name,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=32,
    )
    assert "Paris" in reply.choices[0].message.content
    stream = client.chat.completions.create(
        model=server.served_name,
        messages=[{"role": "user", "content": "Count from one to five."}],
        max_tokens=16,
        stream=True,
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1


def test_metrics_become_normalised_samples_that_move(vllm_server):
    from openai import OpenAI

    _, server = vllm_server
    poller = MetricsPoller(server.base_url)
    before = poller.poll()
    assert before.get("error") is None and before["engine"] == "vllm"
    assert before["num_kv_blocks_total"] > 0 and before["kv_cache_usage"] is not None
    OpenAI(base_url=server.base_url, api_key="unused").completions.create(
        model=server.served_name, prompt="Once upon a time", max_tokens=24, temperature=0
    )
    after = poller.poll()
    assert after["generation_tokens_total"] - before["generation_tokens_total"] >= 24
    assert after["generation_tokens_per_s"] > 0 and after["prompt_tokens_per_s"] > 0
    assert after["num_requests_running"] == 0 and after["num_preemptions_total"] == 0
    assert server.rss_bytes() > 100 * 1024**2  # API server + EngineCore + worker


def test_stop_leaves_no_process_behind(vllm_server):
    servers, server = vllm_server
    pids = [p.pid for p in server.processes()]
    assert len(pids) >= 2  # the API server and its EngineCore (and worker) children
    message = servers.stop("vllm")
    assert str(server.pid) in message
    left = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert left == []
    assert server.status().state == "stopped" and servers.ready() is None


def test_failed_start_shows_vllms_own_error_lines(tmp_path):
    broken = tmp_path / "not-a-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"architectures": ["NoSuchModelForCausalLM"], "model_type": "nope"}')
    servers = ExternalServers()
    try:
        server = servers.start(vllm_plan(str(broken)), "vllm")
        status = server.wait_ready(START_TIMEOUT_S)
    finally:
        servers.stop_all()
    assert status.state == "failed" and "exited with code" in status.phase
    assert any("Error" in line for line in status.error), status.error
