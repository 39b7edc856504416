"""Monitor tab: any server's Prometheus /metrics (vLLM, SGLang, TGI, llama.cpp, ours) in the live charts."""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from backend.monitor.samples import metrics_url
from backend.url_guard import URLGuard
from ui import charts
from ui.common import AppContext, count, error_message, info_message, message, percent, tok_s

MAX_SAMPLES = 180


def summary_html(sample: dict[str, Any]) -> str:
    body = (
        f"engine <b>{html.escape(str(sample.get('engine')))}</b> · "
        f"running <b>{count(sample.get('num_requests_running'))}</b> · "
        f"waiting <b>{count(sample.get('num_requests_waiting'))}</b> · "
        f"KV cache <b>{percent(sample.get('kv_cache_usage'))}</b> · generation "
        f"<b>{tok_s(sample.get('generation_tokens_per_s'))}</b> · prefix hits "
        f"<b>{percent(sample.get('prefix_cache_hit_rate'))}</b>"
    )
    return message("info", body_html=body, elem_id="monitor-now")


def start_monitor(url: str, ctx: AppContext | None = None) -> tuple:
    """(timer update, message, samples, poller or None). Polls once at once so a wrong or refused URL is
    reported here. The poller lives in the browser session's gr.State (it keeps the previous counters to
    compute rates) and goes with the session.

    In public mode ctx's guard refuses what a visitor may not fetch; this app's own API key is sent
    only to this app's own /metrics."""
    from backend.monitor.samples import MetricsPoller

    url = (url or "").strip()
    off = gr.Timer(active=False)
    if not url.startswith(("http://", "https://")):
        return off, error_message(f"URL must start with http:// or https://, got {url!r}"), [], None
    guard, key = (ctx.guard, ctx.key_for(metrics_url(url))) if ctx is not None else (URLGuard(), None)
    poller = MetricsPoller(url, key, transport=guard.transport())
    sample = poller.poll()
    if sample.get("error"):  # unreachable host, HTTP error, not a metrics page
        return off, error_message(f"cannot read metrics: {sample['error']}"), [], None
    if sample["engine"] == "unknown":
        return off, error_message(f"{url} answers, but with no metrics of a known engine"), [], None
    return gr.Timer(active=True), summary_html(sample), [sample], poller


def poll_monitor(poller: Any, samples: list[dict[str, Any]]) -> tuple:
    """Timer handler: (message, chart, samples)."""
    if poller is None:
        return gr.skip(), gr.skip(), gr.skip()
    sample = poller.poll()
    if sample.get("error"):  # the server went away: keep the chart, say so, keep trying
        return error_message(f"poll failed: {sample['error']} (retrying every second)"), gr.skip(), gr.skip()
    samples = [*samples, sample][-MAX_SAMPLES:]
    return summary_html(sample), charts.live_figure(samples, title=f"{sample.get('engine')} metrics"), samples


def build(ctx: AppContext) -> None:
    samples = gr.State([])
    poller = gr.State(None)  # this browser session's MetricsPoller; Gradio drops it with the session
    gr.Markdown("Watch any OpenAI-compatible server through its Prometheus `/metrics` endpoint.")
    with gr.Row():
        url = gr.Textbox(
            ctx.api_base.removesuffix("/v1") + "/metrics", label="Metrics URL", scale=4, elem_id="monitor-url"
        )
        start = gr.Button("Start", variant="primary", scale=1, elem_id="monitor-start")
        stop = gr.Button("Stop", scale=1)
    message_box = gr.HTML(info_message("Not polling."), elem_id="monitor-message")
    chart = gr.Plot(label="Live metrics", elem_id="monitor-chart")
    timer = gr.Timer(1.0, active=False)

    def on_start(url_text: str) -> tuple:
        return start_monitor(url_text, ctx)

    def on_stop() -> tuple:
        return gr.Timer(active=False), info_message("Stopped polling."), None

    start.click(on_start, url, [timer, message_box, samples, poller], api_name="monitor_start")
    timer.tick(poll_monitor, [poller, samples], [message_box, chart, samples], show_progress="hidden")
    stop.click(on_stop, None, [timer, message_box, poller])
