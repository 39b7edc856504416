"""The server a soak run drives: `python app.py serve` started on a free loopback port (and stopped by
its process id afterwards), or one already running at --base-url. Reads its RSS and KV blocks."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 600  # the default model loads in about 30 s on 2 cores; a busy machine is slower


def metric_value(text: str, name: str) -> float | None:
    """The first sample called ``name`` in a Prometheus text, or None."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return None


class ServerUnderTest:
    def __init__(self, base_url: str | None, model: str | None, extra_args: tuple[str, ...] = ()) -> None:
        self.base_url, self.model, self.extra_args = base_url, model, extra_args
        self.proc: subprocess.Popen | None = None
        self.url = base_url.rstrip("/") if base_url else ""

    def __enter__(self) -> ServerUnderTest:
        if self.base_url is None:
            self._start()
        return self

    def __exit__(self, *_exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _start(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        command = [sys.executable, "app.py", "serve", "--port", str(port), "--disable-uvicorn-access-log"]
        command += ["--model", self.model] if self.model else []
        command += list(self.extra_args)
        self.log = Path(tempfile.mkstemp(prefix="soak-server-", suffix=".log")[1])
        print(f"starting {' '.join(command[1:])} (log: {self.log})", flush=True)
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=os.environ
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def scrape(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=30).text

    def rss_bytes(self) -> int:
        """The server's resident memory: from its process when we started it, else from /metrics."""
        if self.proc is not None:
            return psutil.Process(self.proc.pid).memory_info().rss
        return int(metric_value(self.scrape(), "process_resident_memory_bytes") or 0)

    async def wait_idle(self, timeout_s: float = 60.0) -> float:
        """KV blocks in use once nothing runs or waits (or whatever is left after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = await asyncio.to_thread(self.scrape)
            used = metric_value(text, "playground:kv_cache_blocks_used")
            busy = (metric_value(text, "vllm:num_requests_running") or 0) + (
                metric_value(text, "vllm:num_requests_waiting") or 0
            )
            if (used == 0 and busy == 0) or time.monotonic() > deadline:
                return -1.0 if used is None else used
            await asyncio.sleep(0.2)
