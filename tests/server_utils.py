"""Helpers shared by the server, benchmark and monitor tests (no tests here): a real uvicorn server on
a free 127.0.0.1 port in a background thread, over a real engine, stopped by the test."""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import httpx

from tests.common_utils import stop_process


class RunningServer:
    """uvicorn serving ``app`` on 127.0.0.1 (port picked by the OS) until stop()."""

    def __init__(self, app) -> None:
        import uvicorn

        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="test-uvicorn", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_engine(model: str, **engine_options):
    from backend.engine import LLM, AsyncLLM

    return AsyncLLM(LLM(model, **engine_options))


@contextmanager
def tiny_llama_server():
    """(engine, server): a tiny random llama served as "tiny" (8 sequences, 256 KV blocks, 512 tokens)."""
    from backend.server import build_app
    from tests.engine_utils import tiny_model

    engine = start_engine(tiny_model("llama")[0], max_num_seqs=8, num_kv_blocks=256, max_model_len=512)
    server = RunningServer(build_app(lambda: engine, served_model_name="tiny"))
    try:
        yield engine, server
    finally:
        server.stop()
        engine.shutdown()


def wait_until(condition, timeout_s: float = 30.0, what: str = "condition") -> None:
    """Poll ``condition()`` until true; a state wait, not a speed check."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def scrape(url: str, api_key: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    resp = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    resp.raise_for_status()
    return resp.text


@cache
def long_context_tiny_model() -> str:
    """A tiny random Llama with the default model's tokenizer and an 8192-token context, so that a
    request can stay running for a while (queue and disconnect tests)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from tests.engine_utils import tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = Path(tempfile.mkdtemp(prefix="server-tests-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


class ServeProcess:
    """`python app.py serve` in a subprocess on a free 127.0.0.1 port, stopped by process id."""

    def __init__(self, log_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        import os
        import subprocess
        import sys

        from tests.common_utils import ROOT, free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = [sys.executable, "app.py", "serve", "--port", str(self.port), *args]
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with log_path.open("w") as out:
            self.proc = subprocess.Popen(
                command, cwd=ROOT, env=full_env, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            wait_until(self._ready, timeout_s=180, what="`app.py serve` to answer /health")
        except AssertionError:
            self.stop()
            raise AssertionError(f"the server did not start:\n{log_path.read_text()[-3000:]}") from None

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the server exited:\n{self.log_path.read_text()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def metric(self, name: str) -> float:
        """One unlabelled-or-single-series sample from /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(scrape(self.url)):
            for sample in family.samples:
                if sample.name == name:
                    return sample.value
        raise KeyError(name)

    def stop(self) -> None:
        stop_process(self.proc)
