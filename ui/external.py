"""External servers (vLLM, SGLang, llama.cpp) started with the Export tab's command for the current plan,
when their executables are installed here; the Monitor tab then follows them through /metrics."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
from importlib.util import find_spec
from typing import Any

from ui.common import describe, error_message, ok_message, required_int

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


def launch_command(plan: dict[str, Any], engine: str, port: int) -> str:
    """The exported launch command (every value shell-quoted by the exporter) for this plan."""
    from backend.export import ExportOptions, main_command, resolve
    from backend.planner import PlanRequest

    return main_command(resolve(PlanRequest(**plan), ExportOptions(host="127.0.0.1", port=port)), engine)


class ExternalServers:
    """The external server processes this app started (at most one per engine)."""

    def __init__(self) -> None:
        self.processes: dict[str, subprocess.Popen] = {}
        atexit.register(self.stop_all)

    def start(self, plan: dict[str, Any] | None, engine: str, port: Any) -> str:
        """Start the engine's server for the plan; the message says where Monitor finds its metrics."""
        if engine not in ENGINES:
            return error_message(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if not installed(engine):
            return error_message(ENGINES[engine][1])
        if not plan:
            return error_message("no plan yet: the server runs the Plan tab's model and settings")
        running = self.processes.get(engine)
        if running is not None and running.poll() is None:
            return error_message(f"{engine} is already running (pid {running.pid}); stop it first")
        try:
            command = launch_command(plan, engine, required_int(port, "port"))
        except ValueError as exc:
            return error_message(describe(exc))
        process = subprocess.Popen(["bash", "-c", command], start_new_session=True)
        self.processes[engine] = process
        return ok_message(
            f"started {engine} (pid {process.pid}); once it has loaded, watch it in the Monitor tab at "
            f"http://127.0.0.1:{int(port)}/metrics"
        )

    def stop(self, engine: str) -> str:
        process = self.processes.pop(engine, None)
        if process is None or process.poll() is not None:
            return error_message(f"no {engine} server started from here is running")
        os.killpg(process.pid, signal.SIGTERM)  # the whole session: bash and the server it started
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return ok_message(f"stopped {engine}")

    def stop_all(self) -> None:
        for engine in list(self.processes):
            self.stop(engine)


def build(plan_state: Any) -> None:
    """The Launch tab's accordion: what is installed, and start/stop for what is."""
    import gradio as gr

    servers = ExternalServers()
    status = availability()
    lines = "".join(f"<li><b>{e}</b>: {why or 'installed'}</li>" for e, why in status.items())
    gr.HTML(f"<ul id='external-engines'>{lines}</ul>")
    ready = [engine for engine, why in status.items() if why is None]
    with gr.Row():
        engine = gr.Dropdown(
            ready, value=ready[0] if ready else None, label="Engine", interactive=bool(ready)
        )
        port = gr.Number(8000, label="Port", precision=0, interactive=bool(ready))
    with gr.Row():
        start = gr.Button("Start with the plan's command", interactive=bool(ready))
        stop = gr.Button("Stop", interactive=bool(ready))
    message = gr.HTML(elem_id="external-message")
    start.click(servers.start, [plan_state, engine, port], message)
    stop.click(servers.stop, engine, message)
