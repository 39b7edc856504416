"""ExternalServers: external engines (vLLM, SGLang, llama.cpp) run on this machine with a plan's exported
launch command, one process group per engine, stopped by process id (never by name)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
from importlib.util import find_spec

from backend.export.base import ExportOptions
from backend.export.files import main_command
from backend.export.plan import resolve
from backend.planner.request import PlanRequest

# engine -> (how to find it, what to do when it is missing)
ENGINES = {
    "vllm": ("vllm", "`vllm` is not installed (pip install vllm; it needs a CUDA GPU)"),
    "sglang": ("sglang", "sglang is not installed (pip install 'sglang[all]'; it needs a CUDA GPU)"),
    "llamacpp": ("llama-server", "`llama-server` is not on PATH (build llama.cpp or install its release)"),
}


def installed(engine: str) -> bool:
    name = ENGINES[engine][0]
    return find_spec(name) is not None if engine == "sglang" else shutil.which(name) is not None


def availability() -> dict[str, str | None]:
    """engine -> None when it can be launched here, else why not."""
    return {engine: None if installed(engine) else why for engine, (_, why) in ENGINES.items()}


def launch_command(req: PlanRequest, engine: str, port: int) -> str:
    """The exported launch command (every value shell-quoted by the exporter) for this plan."""
    return main_command(resolve(req, ExportOptions(host="127.0.0.1", port=port)), engine)


class ExternalServers:
    """The external server processes this app started (at most one per engine)."""

    def __init__(self) -> None:
        self.processes: dict[str, subprocess.Popen] = {}
        atexit.register(self.stop_all)

    def start(self, req: PlanRequest | None, engine: str, port: int) -> str:
        """Start the engine's server for the plan and say where its metrics are; ValueError when it cannot."""
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if not installed(engine):
            raise ValueError(ENGINES[engine][1])
        if req is None:
            raise ValueError("no plan yet: the server runs the Plan tab's model and settings")
        running = self.processes.get(engine)
        if running is not None and running.poll() is None:
            raise ValueError(f"{engine} is already running (pid {running.pid}); stop it first")
        command = launch_command(req, engine, port)
        process = subprocess.Popen(["bash", "-c", command], start_new_session=True)
        self.processes[engine] = process
        return (
            f"started {engine} (pid {process.pid}); once it has loaded, watch it in the Monitor tab at "
            f"http://127.0.0.1:{port}/metrics"
        )

    def stop(self, engine: str) -> str:
        process = self.processes.pop(engine, None)
        if process is None or process.poll() is not None:
            raise ValueError(f"no {engine} server started from here is running")
        os.killpg(process.pid, signal.SIGTERM)  # the whole session: bash and the server it started
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return f"stopped {engine}"

    def stop_all(self) -> None:
        for engine in list(self.processes):
            self.stop(engine)
