"""The vLLM export, run for real: launch.sh with vLLM's CPU build (.venv-vllm, `make vllm`) serving the
default model as a dense folder, answered through the openai client and watched through /metrics.

vLLM starts once for the module (about 1-2 minutes on 2 cores). It runs with enforce_eager: no
torch.compile warm-up. It is stopped by process id, with its EngineCore child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import httpx
import psutil
import pytest
from openai import OpenAI

from backend.export import ExportOptions, export_files
from backend.monitor.samples import MetricsPoller
from backend.planner.request import PlanRequest
from tests.common_utils import ROOT, free_port
from tests.export_utils import write_files

# a GGUF conversion and one vLLM start (compile-free) in the module fixture: more than the default timeout
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
VLLM_BIN = ROOT / ".venv-vllm" / "bin"
KEY = "test-key-not-a-secret"
READY_TIMEOUT_S = 900  # compile-free start measured at 2-3 min on a shared 2-core machine


def stop_tree(proc: subprocess.Popen) -> list[int]:
    """SIGTERM the launch script's process tree (vLLM's API server, its EngineCore), then SIGKILL what is
    left; returns the ids of the processes that were running."""
    parent = psutil.Process(proc.pid)
    tree = [parent, *parent.children(recursive=True)]
    for p in reversed(tree):
        with contextlib.suppress(psutil.NoSuchProcess):  # it may have exited with its parent
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=60)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=30)
    proc.wait(timeout=30)
    return [p.pid for p in tree]


def wait_ready(proc: subprocess.Popen, url: str, log) -> float:
    start = time.monotonic()
    while time.monotonic() - start < READY_TIMEOUT_S:
        if proc.poll() is not None:
            log.seek(0)
            pytest.fail(f"vLLM exited with {proc.returncode}:\n{log.read()[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(2)
    pytest.fail(f"vLLM did not answer /health within {READY_TIMEOUT_S} s")


@pytest.fixture(scope="module")
def vllm_server(default_dense_model, tmp_path_factory):
    if not (VLLM_BIN / "vllm").exists():
        pytest.fail("no .venv-vllm: run `make vllm` (make test does it first)")
    port = free_port()
    req = PlanRequest(
        model=str(default_dense_model), max_model_len=2048, max_num_seqs=4, max_num_batched_tokens=2048,
        gpu_memory_utilization=0.1,  # on vLLM's CPU build: the share of host memory for weights and KV
    )  # fmt: skip
    options = ExportOptions(
        port=port, served_model_name="smollm2", api_key_env="TEST_VLLM_KEY", enforce_eager=True
    )
    out = write_files(
        export_files(req, options, engines=["vllm"], formats=["shell"]), tmp_path_factory.mktemp("x")
    )
    env = {**os.environ, "PATH": f"{VLLM_BIN}:{os.environ['PATH']}", "TEST_VLLM_KEY": KEY}
    env.pop("VLLM_API_KEY", None)
    log = (tmp_path_factory.mktemp("log") / "vllm.log").open("w+")
    proc = subprocess.Popen(
        ["bash", str(out / "vllm" / "launch.sh")], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        ready_s = wait_ready(proc, url, log)
        print(f"\nvLLM {VLLM_BIN.parent.name} ready in {ready_s:.0f} s")
        yield url, proc
    finally:
        pids = stop_tree(proc)
        log.close()
        left = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        assert not left, f"vLLM processes left running: {left}"


def test_exported_launch_script_serves_a_correct_chat_answer(vllm_server):
    url, proc = vllm_server
    children = psutil.Process(proc.pid).children(recursive=True)
    assert any("EngineCore" in " ".join(p.cmdline()) or p.name().startswith("VLLM") for p in children)
    client = OpenAI(base_url=f"{url}/v1", api_key=KEY)
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=20,
        temperature=0,
    )
    assert "Paris" in reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0
    # the key came from VLLM_API_KEY (never on the command line): a request without it is refused
    assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
    assert KEY not in " ".join(psutil.Process(proc.pid).children()[0].cmdline())


def test_monitor_adapter_reads_vllms_metrics(vllm_server):
    url, _ = vllm_server
    poller = MetricsPoller(f"{url}/v1", api_key=KEY)
    sample = poller.poll()
    assert sample.get("error") is None, sample.get("error")
    assert sample["engine"] == "vllm"
    assert sample["num_requests_running"] == 0 and sample["num_requests_waiting"] == 0
    assert sample["generation_tokens_total"] >= 1 and sample["prompt_tokens_total"] >= 10
    assert sample["num_kv_blocks_total"] and sample["num_kv_blocks_total"] > 0
