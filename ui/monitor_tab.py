"""Monitor tab: any server's Prometheus /metrics (vLLM, SGLang, TGI, llama.cpp, ours) in the live charts."""

from __future__ import annotations

from typing import Any

import gradio as gr

from backend.bench.monitor import metrics_url
from backend.url_guard import URLGuard
from ui import charts
from ui.common import AppContext, error_message, info_message, percent, tok_s

MAX_SAMPLES = 180


class Pollers:
    """One MetricsPoller per browser session (each keeps its previous counters to compute rates)."""

    def __init__(self) -> None:
        self._by_session: dict[str, Any] = {}

    def start(self, session: str, url: str, guard: URLGuard, api_key: str | None = None) -> Any:
        from backend.bench.monitor import MetricsPoller

        poller = MetricsPoller(url, api_key, transport=guard.transport())
        self._by_session[session] = poller
        return poller

    def get(self, session: str) -> Any | None:
        return self._by_session.get(session)

    def stop(self, session: str) -> None:
        self._by_session.pop(session, None)


def summary_html(sample: dict[str, Any]) -> str:
    return (
        f"<div class='msg msg-info' id='monitor-now'>engine <b>{sample.get('engine')}</b> · "
        f"running <b>{sample.get('num_requests_running')}</b> · "
        f"waiting <b>{sample.get('num_requests_waiting')}</b> · "
        f"KV cache <b>{percent(sample.get('kv_cache_usage'))}</b> · generation "
        f"<b>{tok_s(sample.get('generation_tokens_per_s'))}</b> · prefix hits "
        f"<b>{percent(sample.get('prefix_cache_hit_rate'))}</b></div>"
    )


def start_monitor(pollers: Pollers, session: str, url: str, ctx: AppContext | None = None) -> tuple:
    """(timer update, message, samples). Polls once at once so a wrong or refused URL is reported here.

    In public mode ctx's guard refuses what a visitor may not fetch; this app's own API key is sent
    only to this app's own /metrics."""
    url = (url or "").strip()
    if not url.startswith(("http://", "https://")):
        return (
            gr.Timer(active=False),
            error_message(f"URL must start with http:// or https://, got {url!r}"),
            [],
        )
    guard, key = (ctx.guard, ctx.key_for(metrics_url(url))) if ctx is not None else (URLGuard(), None)
    sample = pollers.start(session, url, guard, key).poll()
    if sample.get("error"):  # unreachable host, HTTP error, not a metrics page
        pollers.stop(session)
        return gr.Timer(active=False), error_message(f"cannot read metrics: {sample['error']}"), []
    if sample["engine"] == "unknown":
        pollers.stop(session)
        return (
            gr.Timer(active=False),
            error_message(f"{url} answers, but with no metrics of a known engine"),
            [],
        )
    return gr.Timer(active=True), summary_html(sample), [sample]


def poll_monitor(pollers: Pollers, session: str, samples: list[dict[str, Any]]) -> tuple:
    """Timer handler: (message, chart, samples)."""
    poller = pollers.get(session)
    if poller is None:
        return gr.skip(), gr.skip(), gr.skip()
    sample = poller.poll()
    if sample.get("error"):  # the server went away: keep the chart, say so, keep trying
        return error_message(f"poll failed: {sample['error']} (retrying every second)"), gr.skip(), gr.skip()
    samples = [*samples, sample][-MAX_SAMPLES:]
    return summary_html(sample), charts.live_figure(samples, title=f"{sample.get('engine')} metrics"), samples


def build(ctx: AppContext) -> None:
    pollers = Pollers()
    samples = gr.State([])
    gr.Markdown("Watch any OpenAI-compatible server through its Prometheus `/metrics` endpoint.")
    with gr.Row():
        url = gr.Textbox(
            ctx.api_base.removesuffix("/v1") + "/metrics", label="Metrics URL", scale=4, elem_id="monitor-url"
        )
        start = gr.Button("Start", variant="primary", scale=1, elem_id="monitor-start")
        stop = gr.Button("Stop", scale=1)
    message = gr.HTML(info_message("Not polling."), elem_id="monitor-message")
    chart = gr.Plot(label="Live metrics", elem_id="monitor-chart")
    timer = gr.Timer(1.0, active=False)

    def on_start(url_text: str, request: gr.Request) -> tuple:
        return start_monitor(pollers, request.session_hash or "", url_text, ctx)

    def on_tick(history: list, request: gr.Request) -> tuple:
        return poll_monitor(pollers, request.session_hash or "", history)

    def on_stop(request: gr.Request) -> tuple:
        pollers.stop(request.session_hash or "")
        return gr.Timer(active=False), info_message("Stopped polling.")

    start.click(on_start, url, [timer, message, samples], api_name="monitor_start")
    timer.tick(on_tick, samples, [message, chart, samples], show_progress="hidden")
    stop.click(on_stop, None, [timer, message])
