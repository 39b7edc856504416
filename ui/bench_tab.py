"""Benchmark tab: the serving benchmark (backend.bench.serve) against the embedded engine or any URL."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import gradio as gr

from ui.common import (
    AppContext,
    describe,
    error_message,
    form_values,
    message,
    ms,
    ok_message,
    required_int,
    tok_s,
)
from ui.inputs import form_number

EMBEDDED = "Embedded engine (this server's /v1)"
EXTERNAL = "External engine started in the Launch tab (vLLM, ...)"
REQUEST_TIMEOUT_S = 120.0
PERCENTILE_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency"))


def bench_config(ctx: AppContext, form: dict[str, Any]):
    """The form (field name -> value) as a BenchConfig; ValueError naming the field for a bad value."""
    from backend.bench.serve import BenchConfig

    target, model = form["target"], (form["model"] or "").strip()
    if target == EMBEDDED:
        engine = ctx.holder.get()
        if engine is None:
            raise ValueError(
                "the embedded engine is not running: press Launch in the Launch tab, or pick a URL"
            )
        base_url, model = ctx.api_base, model or engine.model_name
    elif target == EXTERNAL:
        server = ctx.external.ready()
        if server is None:
            raise ValueError("no external engine is ready: start one under Launch → External engines")
        base_url, model = server.base_url, model or server.served_name
    else:
        base_url = (form["url"] or "").strip()
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"server URL must start with http:// or https://, got {base_url!r}")
        if not model:
            raise ValueError("model is required for an external server (the name its /v1/models lists)")
    ctx.guard.check(base_url)  # a refused URL is a message here, before any request
    return BenchConfig(
        base_url=base_url,
        model=model,
        dataset="random",
        num_prompts=limited(ctx, form["num_prompts"], "number of requests", "max_bench_requests"),
        input_len=limited(ctx, form["input_len"], "input length (tokens)", "max_input_tokens"),
        output_len=limited(ctx, form["output_len"], "output length (tokens)", "max_tokens"),
        max_concurrency=limited(ctx, form["concurrency"], "max concurrency", "max_concurrency"),
        ignore_eos=True,
        api_key=ctx.key_for(base_url),
        timeout_s=REQUEST_TIMEOUT_S,
    )


def limited(ctx: AppContext, value: Any, name: str, knob: str) -> int:
    """A whole number >= 1 within the public policy's ``knob`` limit; ValueError naming the field."""
    return ctx.policy.limit(required_int(value, name), knob, name)


def check_reachable(ctx: AppContext, config: Any) -> None:
    """Fail fast (5 s) with a clear message instead of timing out request by request."""
    import httpx

    url = config.base_url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    transport = ctx.guard.transport()
    try:
        with httpx.Client(transport=transport, trust_env=transport is None) as client:
            client.get(url, headers=headers, timeout=5.0)
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot reach {config.base_url}: {describe(exc) or type(exc).__name__}") from None


def percentile_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for key, label in PERCENTILE_METRICS:
        values = [result.get(f"{stat}_{key}_ms") for stat in ("mean", "median", "p90", "p99")]
        if any(v is not None for v in values):
            rows.append([label, *("–" if v is None else f"{v:,.1f} ms" for v in values)])
    return rows


def plan_for(ctx: AppContext, target: str, plan: dict[str, Any] | None, config: Any) -> dict[str, Any] | None:
    """What the planner predicts for the measured setup: the launched model on this machine for the
    embedded engine, the Plan tab's deployment for another server; lengths and concurrency as benchmarked."""
    from backend.planner.launch_here import running_engine_plan

    workload = dict(
        input_len=config.input_len,
        output_len=config.output_len,
        concurrency=config.max_concurrency or config.num_prompts,
    )
    status, stats = ctx.holder.status(), ctx.holder.stats()
    if target == EMBEDDED and status.config is not None and stats is not None and stats.device == "cpu":
        return running_engine_plan(status.config, stats, **workload).to_dict()
    return {**plan, **workload} if plan and target != EMBEDDED else None


def comparison_html(result: dict[str, Any], plan: dict[str, Any] | None) -> str:
    """Measured against the planner's estimate, side by side."""
    from backend.planner import PlanRequest, estimate

    rows = [
        ("Median TTFT", ms(result["median_ttft_ms"] / 1000), "ttft_s", ms),
        ("Median TPOT", ms(result["median_tpot_ms"] / 1000), "tpot_s", ms),
        ("Output throughput", tok_s(result["output_throughput"]), "decode_tokens_per_s_total", tok_s),
    ]
    note, est = "no plan to compare with (fill in the Plan tab)", None
    if plan:
        try:
            est = estimate(PlanRequest(**plan)).to_dict()
            note = f"estimate: {html.escape(Path(plan['model']).name)} on {plan['num_gpus']} × {plan['gpu']}"
        except ValueError as exc:
            note = f"estimate unavailable: {html.escape(describe(exc))}"
    body = "".join(
        f"<tr><td>{name}</td><td><b>{measured}</b></td><td>{fmt(est[key]) if est else '–'}</td></tr>"
        for name, measured, key, fmt in rows
    )
    return message(
        "info",
        elem_id="bench-summary",
        body_html=f"{result['completed']} completed, {result['failed']} failed in "
        f"{result['duration']:.1f} s · {result['request_throughput']:.2f} requests/s"
        f"<table><tr><th></th><th>measured</th><th>planner estimate</th></tr>{body}</table>{note}",
    )


def run(ctx: AppContext, form: dict[str, Any], progress: Any = None) -> tuple:
    """(message, table, summary, figure) for the form (form["plan"]: the Plan tab's plan, or None)."""
    from backend.bench.plots import latency_figure
    from backend.bench.serve import run_benchmark

    try:
        config = bench_config(ctx, form)
        check_reachable(ctx, config)
        estimate_plan = plan_for(ctx, form["target"], form["plan"], config)
    except ValueError as exc:
        return error_message(describe(exc)), gr.skip(), gr.skip(), gr.skip()

    def report(done: int, total: int) -> None:
        if progress is not None:
            progress(done / max(total, 1), desc=f"{done}/{total} requests")

    try:
        result = run_benchmark(config, progress=report, transport=ctx.guard.async_transport())
    except Exception as exc:  # unreachable server, wrong model name, HTTP errors
        return error_message(f"benchmark failed: {describe(exc)}"), gr.skip(), gr.skip(), gr.skip()
    data = result.to_dict()
    if not result.completed:
        errors = data["errors"] or ["no response"]
        return (
            error_message(f"all {result.failed} requests failed: {errors[0]}"),
            gr.skip(),
            gr.skip(),
            gr.skip(),
        )
    message = ok_message(f"done: {result.completed} requests completed, {result.failed} failed")
    return message, percentile_rows(data), comparison_html(data, estimate_plan), latency_figure(result)


def build(ctx: AppContext, plan_state: gr.State) -> None:
    form: dict[str, Any] = {"plan": plan_state}
    with gr.Row():
        with gr.Column(scale=2):
            form["target"] = gr.Radio(
                [EMBEDDED, EXTERNAL, "Another server (URL)"], value=EMBEDDED, label="Target"
            )
            form["url"] = gr.Textbox(
                "http://127.0.0.1:8000/v1", label="Server URL (OpenAI-compatible, ends in /v1)"
            )
            form["model"] = gr.Textbox("", label="Model name (empty = the embedded engine's)")
            with gr.Row():
                form["num_prompts"] = form_number(
                    16, label="Requests", precision=0, minimum=1, elem_id="bench-requests"
                )
                form["concurrency"] = form_number(4, label="Max concurrency", precision=0, minimum=1)
            with gr.Row():
                form["input_len"] = form_number(
                    128, label="Input tokens", precision=0, minimum=1, elem_id="bench-input"
                )
                form["output_len"] = form_number(
                    32, label="Output tokens", precision=0, minimum=1, elem_id="bench-output"
                )
            start = gr.Button("Run benchmark", variant="primary", elem_id="bench-run")
            message_box = gr.HTML(elem_id="bench-message")
        with gr.Column(scale=3):
            table = gr.Dataframe(
                headers=["metric", "mean", "median", "p90", "p99"],
                elem_id="bench-table",
                interactive=False,
                label="Latency percentiles",
            )
            summary = gr.HTML(elem_id="bench-summary-box")
            figure = gr.Plot(label="Latency distribution", elem_id="bench-figure")

    def on_run(data: dict, progress: gr.Progress = gr.Progress()) -> tuple:  # noqa: B008 (Gradio's idiom)
        return run(ctx, form_values(form, data), progress=progress)

    start.click(on_run, set(form.values()), [message_box, table, summary, figure], api_name="benchmark")
