"""The Launch tab's "External engines" accordion: start and stop vLLM, SGLang or llama.cpp with the
current plan's exported command (backend/export/supervisor.py); the Monitor tab follows them."""

from __future__ import annotations

from typing import Any

import gradio as gr

from backend.export.supervisor import ExternalServers, availability
from backend.planner.request import PlanRequest
from ui.common import describe, error_message, ok_message, required_int


def start(servers: ExternalServers, plan: dict[str, Any] | None, engine: str, port: Any) -> str:
    try:
        req = PlanRequest(**plan) if plan else None
        return ok_message(servers.start(req, engine, required_int(port, "port")))
    except ValueError as exc:
        return error_message(describe(exc))


def stop(servers: ExternalServers, engine: str) -> str:
    try:
        return ok_message(servers.stop(engine))
    except ValueError as exc:
        return error_message(describe(exc))


def build(plan_state: Any) -> None:
    """What is installed, and start/stop for what is."""
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
        start_button = gr.Button("Start with the plan's command", interactive=bool(ready))
        stop_button = gr.Button("Stop", interactive=bool(ready))
    message = gr.HTML(elem_id="external-message")
    start_button.click(lambda *args: start(servers, *args), [plan_state, engine, port], message)
    stop_button.click(lambda name: stop(servers, name), engine, message)
