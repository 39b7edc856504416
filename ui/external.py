"""The Launch tab's "External engines" accordion: start vLLM, SGLang or llama.cpp with the plan's exported
command (backend/export/supervisor.py), follow its startup phases and log, stop it. Once it is ready, Chat,
the live charts, Benchmark and Compare use it."""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from backend.export.supervisor import ExternalServers, availability
from backend.planner.request import PlanRequest
from ui.common import describe, error_message, gib, message, ok_message, optional_int
from ui.inputs import form_number

LOG_LINES = 80


def default_plan(engine: str) -> PlanRequest:
    """Without a plan: the default model as a dense folder (what vLLM loads), small CPU settings."""
    from backend.bench.compare_targets import dense_cache_dir, model_folder

    return PlanRequest(
        model=model_folder(None, dense_cache_dir()),
        gpu="CPU",
        engine=engine,
        quant="bf16",
        max_model_len=2048,
        max_num_seqs=32,
        max_num_batched_tokens=2048,
        block_size=32,  # vLLM's CPU attention needs a multiple of 32
    )


DEFAULT_MODEL = "the default model"
PLAN = "the Plan tab's plan"


def start(
    servers: ExternalServers, plan: dict[str, Any] | None, engine: str, port: Any, source: str = PLAN
) -> str:
    """Start the engine for the plan (or the default model); the message says where, or what is wrong."""
    try:
        if source == PLAN and not plan:
            raise ValueError("no plan yet: fill in the Plan tab, or choose the default model")
        req = PlanRequest(**plan) if source == PLAN else default_plan(engine)
        server = servers.start(req, engine, optional_int(port, "port", minimum=1024))
    except ValueError as exc:
        return error_message(describe(exc))
    return ok_message(f"started {engine} (pid {server.pid}) on {server.base_url}; it is loading …")


def stop(servers: ExternalServers, engine: str) -> str:
    try:
        return ok_message(servers.stop(engine))
    except ValueError as exc:
        return error_message(describe(exc))


_PLANNED: dict[int, dict] = {}  # pid -> the planner's figures for the server's settings (computed once)


def memory_html(server: Any) -> str:
    """Memory truth: measured resident memory and KV capacity beside the planner's estimate."""
    from backend.bench.compare_targets import planned

    if server.pid not in _PLANNED:
        _PLANNED[server.pid] = planned(server.plan) if server.plan is not None else {}
    plan = _PLANNED[server.pid]
    rss, kv = server.rss_bytes(), server.startup.kv_cache_tokens
    return (
        f"<div id='external-memory'>RSS {gib(rss)} (server + engine processes) · "
        f"weights (plan) {gib(plan.get('weights_bytes'))} · "
        f"KV cache {kv or 0:,} tokens (plan: {plan.get('kv_cache_tokens') or 0:,})</div>"
    )


def status_html(servers: ExternalServers, engine: str | None) -> str:
    server = servers.get(engine) if engine else None
    if server is None:
        return message("info", "Not started.", elem_id="external-state", data={"state": "none"})
    s = server.status()
    where = f"pid {s.pid} · {html.escape(s.base_url)} · {s.seconds:.0f} s"
    head = f"<b>{html.escape(s.engine)}</b> · {s.state} · {where}"
    kv = f" · KV cache {s.kv_cache_tokens:,} tokens" if s.kv_cache_tokens else ""
    bar = f"<progress value='{s.progress:.2f}' max='1' style='width:100%'></progress>"
    body = f"{head}<br>{html.escape(s.phase)}{kv}{bar}"
    if s.state == "ready":
        body += memory_html(server)
    if s.state == "failed":
        lines = html.escape("\n".join(s.error))
        body += f"<pre id='external-error' style='white-space:pre-wrap;font-size:0.8em'>{lines}</pre>"
    kind = {"ready": "ok", "failed": "error"}.get(s.state, "info")
    return message(kind, body_html=body, elem_id="external-state", data={"state": s.state})  # type: ignore[arg-type]


def log_text(servers: ExternalServers, engine: str | None) -> str:
    server = servers.get(engine) if engine else None
    return "" if server is None else "\n".join(list(server.log)[-LOG_LINES:])


def build(servers: ExternalServers, plan_state: Any) -> None:
    """What is installed (with the install command when not), and start/stop/log for what is."""
    status = availability()
    lines = "".join(f"<li><b>{e}</b>: {html.escape(why or 'installed')}</li>" for e, why in status.items())
    gr.HTML(f"<ul id='external-engines'>{lines}</ul>")
    ready = [engine for engine, why in status.items() if why is None]
    with gr.Row():
        engine = gr.Dropdown(
            ready,
            value=ready[0] if ready else None,
            label="Engine",
            interactive=bool(ready),
            elem_id="external-engine",
        )
        port = form_number(0, label="Port (0 = a free one)", precision=0, minimum=0, interactive=bool(ready))
        source = gr.Radio([DEFAULT_MODEL, PLAN], value=DEFAULT_MODEL, label="Model and settings")
    with gr.Row():
        start_button = gr.Button(
            "Start (the plan's command, or the default model)",
            interactive=bool(ready),
            elem_id="external-start",
        )
        stop_button = gr.Button("Stop", interactive=bool(ready), elem_id="external-stop")
    message = gr.HTML(elem_id="external-message")
    state = gr.HTML(status_html(servers, None), elem_id="external-status")
    log = gr.Textbox("", label="Engine log", lines=10, max_lines=10, autoscroll=True, elem_id="external-log")
    start_button.click(lambda *args: start(servers, *args), [plan_state, engine, port, source], message)
    stop_button.click(lambda name: stop(servers, name), engine, message)
    timer = gr.Timer(1.0)
    timer.tick(
        lambda name: (status_html(servers, name), log_text(servers, name)),
        engine,
        [state, log],
        show_progress="hidden",
    )
