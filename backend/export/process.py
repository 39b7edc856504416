"""ManagedServer: one engine server run as a child process on 127.0.0.1, with its log, startup phase,
health, resident memory and a stop that ends it and all its descendants by process id (psutil)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from backend.export.startup import Startup, error_lines
from backend.monitor.samples import MetricsPoller

LOG_LINES = 2000
HISTORY_SAMPLES = (
    180  # live charts: about three minutes of one-per-second samples, as for the embedded engine
)


@dataclass(slots=True)
class ServerStatus:
    engine: str
    state: str  # "starting" | "ready" | "failed" | "stopped"
    pid: int | None
    base_url: str  # the OpenAI API root, http://127.0.0.1:PORT/v1
    phase: str
    progress: float  # 0..1 of the startup
    seconds: float  # since the start
    error: list[str] = field(default_factory=list)  # the engine's own error lines when it failed
    kv_cache_tokens: int | None = None


class ManagedServer:
    """A started engine server. `command` is one bash command line (the exporter's, shell-quoted)."""

    def __init__(
        self, engine: str, command: str, port: int, env: dict[str, str], served_name: str, cwd=None
    ) -> None:
        self.engine, self.command, self.port, self.env, self.cwd = engine, command, port, env, cwd
        self.served_name = served_name  # the model name its /v1 answers to
        self.plan: Any = None  # the PlanRequest it was started for
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.health_url = f"http://127.0.0.1:{port}/health"
        self.log: deque[str] = deque(maxlen=LOG_LINES)
        self.startup = Startup(engine)
        self.process: subprocess.Popen | None = None
        self.started = 0.0
        self.stopped = False
        self._ready = False
        self._samples: deque[dict] = deque(maxlen=HISTORY_SAMPLES)
        self._poller: MetricsPoller | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self) -> None:
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            ["bash", "-c", "exec " + self.command],  # exec: the pid is the server itself
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.cwd,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,  # Ctrl-C in the app's terminal does not reach it; stop() does
        )
        threading.Thread(target=self._read_log, name=f"{self.engine}-log", daemon=True).start()

    def _read_log(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            line = line.rstrip("\n")
            self.log.append(line)
            self.startup.feed(line)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            return httpx.get(self.health_url, timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def status(self) -> ServerStatus:
        seconds = time.monotonic() - self.started if self.started else 0.0
        if self.stopped:
            state = "stopped"
        elif not self.alive():
            state = "failed"
            self._ready = False
        elif self._ready or self.healthy():
            state, self._ready = "ready", True
        else:
            state = "starting"
        startup = self.startup
        progress, phase = (1.0, "ready") if state == "ready" else (startup.progress, startup.phase)
        if state == "failed":
            code = self.process.returncode if self.process else None
            phase = f"exited with code {code} during startup" if not startup.progress >= 1 else "exited"
        error = error_lines(list(self.log)) if state == "failed" else []
        return ServerStatus(
            self.engine,
            state,
            self.pid,
            self.base_url,
            phase,
            progress,
            seconds,
            error,
            startup.kv_cache_tokens,
        )

    def wait_ready(self, timeout_s: float) -> ServerStatus:
        """Block until ready, failed or timeout_s; the status says which."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if status.state != "starting" or time.monotonic() > deadline:
                return status
            time.sleep(1.0)

    def samples(self, min_interval_s: float = 0.8) -> list[dict]:
        """Normalised /metrics samples (backend.monitor.samples) for the live charts, newest last; a new
        one at most every min_interval_s however many viewers ask."""
        if self._poller is None:
            self._poller = MetricsPoller(self.base_url)
        last = self._samples[-1] if self._samples else None
        if last is None or time.time() - last["timestamp"] >= min_interval_s:
            sample = self._poller.poll()
            if sample.get("error") is None:
                self._samples.append(sample)
        return list(self._samples)

    def processes(self) -> list[psutil.Process]:
        """The server and every process it started (vLLM: the EngineCore and its workers)."""
        if not self.alive():
            return []
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def rss_bytes(self) -> int | None:
        """Resident memory of the server and its children together."""
        total = 0
        for proc in self.processes():
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total or None

    def stop(self, timeout_s: float = 30.0) -> list[int]:
        """SIGTERM the server and its descendants, SIGKILL what is left after timeout_s; the pids ended."""
        self.stopped = True
        procs = self.processes()
        for proc in procs:
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                continue
        _, left = psutil.wait_procs(procs, timeout=timeout_s)
        for proc in left:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        psutil.wait_procs(left, timeout=10)
        if self.process is not None:
            self.process.wait(timeout=10)
        return [p.pid for p in procs]
