"""ExternalServers: external engines (vLLM, SGLang, llama.cpp) run on this machine as managed child
processes with a plan's exported launch command (one source of truth for flags), on 127.0.0.1.

Each server's log is kept (and parsed into startup phases, backend/export/startup.py), readiness is its
health endpoint, and Stop ends it and every process it started (vLLM's EngineCore included) by process id.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import sys
import threading
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from backend.export.base import ExportOptions
from backend.export.files import EXPORTERS, main_command
from backend.export.plan import ExportPlan, resolve
from backend.export.process import ManagedServer
from backend.planner.request import PlanRequest

ROOT = Path(__file__).resolve().parents[2]
CPU_KV_CACHE_GIB = 1  # vLLM's CPU build otherwise sizes its KV cache from a share of all host memory


@dataclass(slots=True, frozen=True)
class EngineSpec:
    """How to run one engine here (its name and traits are backend/engines.py's row)."""

    executable: str  # looked up in $<NAME>_EXECUTABLE's folder, PATH, then the virtualenv below
    venv: str | None  # a virtualenv of this checkout that may hold it
    install: str  # what to run when it is missing
    module: str | None = None  # runs as `python -m` of this Python: installed when the module is found
    env: tuple[tuple[str, str], ...] = ()  # defaults for its environment
    eager_without_gpu: bool = False  # the Launch tab runs it eager on a CPU-only host (see launch_plan)
    is_external: bool = True  # a separate server (the embedded engine runs in the app's own process)


# The engines the app can start here (a subset of backend/engines.py's ENGINES)
LAUNCHABLE: dict[str, EngineSpec] = {
    "embedded": EngineSpec(
        "python",
        None,
        "the embedded engine runs with this checkout's Python",
        module="backend",
        is_external=False,
    ),
    "vllm": EngineSpec(
        "vllm",
        ".venv-vllm",
        "vLLM is not installed: run `make vllm` (vLLM's CPU build in .venv-vllm), or `pip install vllm` "
        "on a GPU machine",
        env=(("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB)),),  # ignored by GPU builds
        eager_without_gpu=True,
    ),
    "sglang": EngineSpec(
        "python",
        None,
        "SGLang is not installed: `pip install 'sglang[all]'` on a GPU machine (no CPU build)",
        module="sglang",
    ),
    "llamacpp": EngineSpec(
        "llama-server",
        None,
        "`llama-server` is not on PATH: install llama.cpp's release (brew install llama.cpp, or build it) "
        "or set LLAMACPP_EXECUTABLE",
    ),
}


def executable_dir(engine: str) -> Path | None:
    """The folder holding the engine's executable, or None when it is not installed."""
    spec = LAUNCHABLE[engine]
    if spec.module is not None:
        return None if find_spec(spec.module) is None else Path(sys.executable).parent
    configured = os.environ.get(f"{engine.upper()}_EXECUTABLE")
    if configured:
        return Path(configured).parent if Path(configured).is_file() else None
    found = shutil.which(spec.executable)
    if found:
        return Path(found).parent
    if spec.venv and (ROOT / spec.venv / "bin" / spec.executable).is_file():
        return ROOT / spec.venv / "bin"
    return None


def installed(engine: str) -> bool:
    return executable_dir(engine) is not None


def availability() -> dict[str, str | None]:
    """external engine -> None when it can be launched here, else why not and how to install it."""
    external = [e for e, spec in LAUNCHABLE.items() if spec.is_external]
    return {e: None if installed(e) else LAUNCHABLE[e].install for e in external}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


def launch_plan(req: PlanRequest, engine: str, port: int, enforce_eager: bool | None = None) -> ExportPlan:
    """The plan as the exporter resolves it for a server here on 127.0.0.1:port. By default (enforce_eager
    None: the Launch tab) vLLM runs eager without a GPU: its CPU build's torch.compile takes minutes here
    and its compiled graph answered differently from the eager one and from transformers (vLLM 0.32.0 CPU,
    torch 2.13). Compare passes False: a speed comparison runs vLLM as it runs by default."""
    if enforce_eager is None:
        enforce_eager = LAUNCHABLE[engine].eager_without_gpu and not has_gpu()
    return resolve(req, ExportOptions(host="127.0.0.1", port=port, enforce_eager=enforce_eager))


def launch_command(req: PlanRequest, engine: str, port: int, enforce_eager: bool | None = None) -> str:
    """The exported launch command (every value shell-quoted by the exporter) for launch_plan."""
    return main_command(launch_plan(req, engine, port, enforce_eager), engine)


def launch_env(engine: str) -> dict[str, str]:
    env = dict(os.environ)
    folder = executable_dir(engine)
    if folder is not None:
        env["PATH"] = f"{folder}{os.pathsep}{env.get('PATH', '')}"
    for name, value in LAUNCHABLE[engine].env:
        env.setdefault(name, value)
    return env


class ExternalServers:
    """The external servers this app started (at most one per engine)."""

    def __init__(self) -> None:
        self.servers: dict[str, ManagedServer] = {}
        self._lock = threading.Lock()
        atexit.register(self.stop_all)

    def start(
        self, req: PlanRequest | None, engine: str, port: int | None = None, enforce_eager: bool | None = None
    ) -> ManagedServer:
        """Start the engine's server for the plan (port None or 0: a free one; enforce_eager as in
        launch_plan); ValueError when it cannot."""
        if engine not in LAUNCHABLE:
            raise ValueError(f"engine must be one of {', '.join(LAUNCHABLE)}, got {engine!r}")
        if not installed(engine):
            raise ValueError(LAUNCHABLE[engine].install)
        if req is None:
            raise ValueError("no plan yet: the server runs the Plan tab's model and settings")
        with self._lock:
            running = self.servers.get(engine)
            if running is not None and running.alive():
                raise ValueError(f"{engine} is already running (pid {running.pid}); stop it first")
            port = port or free_port()
            plan = launch_plan(req, engine, port, enforce_eager)
            command, env = main_command(plan, engine), launch_env(engine)
            name = EXPORTERS[engine].client_model(plan)  # what the command serves the model as
            server = ManagedServer(engine, command, port, env, served_name=name, cwd=ROOT)
            server.plan = req
            server.start()
            self.servers[engine] = server
        return server

    def get(self, engine: str) -> ManagedServer | None:
        return self.servers.get(engine)

    def ready(self) -> ManagedServer | None:
        """The first started server that answers its health check, or None."""
        return next((s for s in list(self.servers.values()) if s.status().state == "ready"), None)

    def stop(self, engine: str) -> str:
        server = self.servers.pop(engine, None)
        if server is None or not server.alive():
            raise ValueError(f"no {engine} server started from here is running")
        server.stop()
        return f"stopped {engine} (pid {server.pid} and its child processes)"

    def stop_all(self) -> None:
        for engine in list(self.servers):
            server = self.servers.pop(engine)
            server.stop()
