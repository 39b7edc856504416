"""Compare tab: the same workload against the embedded engine, engines started in the Launch tab and any
OpenAI URL, one after the other (backend.bench.compare); one table, overlaid charts, JSON and HTML report."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import gradio as gr

from backend.bench.datasets import DATASETS
from ui.common import AppContext, describe, error_message, form_values, ok_message, required_int
from ui.inputs import form_number

EMBEDDED = "embedded"
EXTERNAL = ("vllm", "sglang", "llamacpp")


def embedded_target(ctx: AppContext):
    from backend.bench.compare import CompareTarget
    from backend.bench.compare_targets import planned
    from backend.planner.launch_here import running_engine_plan

    engine, status, stats = ctx.holder.get(), ctx.holder.status(), ctx.holder.stats()
    if engine is None or status.config is None or stats is None:
        raise ValueError("the embedded engine is not running: press Launch in the Launch tab")
    config = status.config
    req = running_engine_plan(config, stats)
    return CompareTarget(
        name=EMBEDDED,
        base_url=ctx.api_base,
        model=engine.model_name,
        pids=lambda: [os.getpid()],  # this app's process: the engine and the UI together
        block_size=stats.block_size,
        planned=planned(req, kv_bytes=stats.kv_pool_bytes),  # the pool it really has, in plan tokens
        tokenizer=config.model,
    )


def external_target(ctx: AppContext, engine: str):
    from backend.bench.compare_targets import server_target

    server = ctx.external.get(engine)
    if server is None or server.status().state != "ready":
        raise ValueError(f"{engine} is not running: start it under Launch → External engines")
    return server_target(server, server.plan)


def targets(ctx: AppContext, chosen: list[str], url: str) -> list:
    from backend.bench.compare_targets import url_target

    out = [embedded_target(ctx) if name == EMBEDDED else external_target(ctx, name) for name in chosen or []]
    if (url or "").strip():
        try:
            out.append(url_target(url.strip()))
        except SystemExit as exc:
            raise ValueError(str(exc)) from None
    if len(out) < 2:
        raise ValueError("choose at least two targets (engines, or one engine and a URL)")
    return out


def run(ctx: AppContext, form: dict[str, Any], progress: Any = None) -> tuple:
    """(message, table, throughput chart, latency chart, KV chart, report files) for the form."""
    from backend.bench.compare import Workload, run_compare, with_target_tokenizer
    from backend.bench.compare_quality import score_running
    from backend.bench.compare_report import fairness_line, figures, quality_lines, table_html, write_report

    skip = (gr.skip(),) * 5
    try:
        workload = Workload(
            dataset=form["dataset"],
            num_prompts=required_int(form["num_prompts"], "requests"),
            max_concurrency=required_int(form["concurrency"], "max concurrency"),
            input_len=required_int(form["input_len"], "input tokens"),
            output_len=required_int(form["output_len"], "output tokens"),
            seed=required_int(form["seed"], "seed", minimum=0),
            timeout_s=300.0,
        )
        chosen_targets = targets(ctx, form["chosen"], form["url"])
        workload = with_target_tokenizer(workload, chosen_targets)  # `random`: as `app.py compare` sends it
    except ValueError as exc:
        return (error_message(describe(exc)), *skip)

    def report(name: str, done: int, total: int) -> None:
        if progress is not None:
            progress(done / max(total, 1), desc=f"{name}: {done}/{total} requests")

    def report_quality(done: int, total: int, label: str) -> None:
        if progress is not None:
            progress(done / max(total, 1), desc=f"quality, {label}: {done}/{total} chunks")

    try:
        comparison = run_compare(chosen_targets, workload, report)
        if form["quality"]:
            embedded = ctx.holder.get() if EMBEDDED in (form["chosen"] or []) else None
            score_running(comparison, chosen_targets, embedded, progress=report_quality)
    except Exception as exc:  # a target went away mid-run: say which, keep the UI alive
        return (error_message(f"comparison failed: {describe(exc)}"), *skip)
    paths = write_report(comparison, tempfile.mkdtemp(prefix="compare-"))
    figs = figures(comparison)
    failed = sum(r.failed for r in comparison.rows())
    message = ok_message(
        f"compared {len(chosen_targets)} targets on {workload.num_prompts} requests each; {failed} failed. "
        + " ".join([fairness_line(comparison), *quality_lines(comparison)])
    )
    files = [str(paths["json"]), str(paths["html"])]
    return message, table_html(comparison.rows()), figs["throughput"], figs["latency"], figs["kv"], files


def build(ctx: AppContext) -> None:
    form: dict[str, Any] = {}
    # the results table spans the page: its dozen columns were cut off beside the form
    table = gr.HTML(elem_id="compare-table-box")
    with gr.Row():
        with gr.Column(scale=2):
            form["chosen"] = gr.CheckboxGroup(
                [EMBEDDED, *EXTERNAL],
                value=[EMBEDDED, "vllm"],
                label="Targets (running engines)",
                elem_id="compare-targets",
            )
            form["url"] = gr.Textbox("", label="Another server (OpenAI URL, optional)")
            form["dataset"] = gr.Dropdown(list(DATASETS), value="chat", label="Dataset")
            with gr.Row():
                form["num_prompts"] = form_number(
                    16, label="Requests", precision=0, minimum=1, elem_id="compare-requests"
                )
                form["concurrency"] = form_number(4, label="Max concurrency", precision=0, minimum=1)
            with gr.Row():
                form["input_len"] = form_number(256, label="Input tokens", precision=0, minimum=1)
                form["output_len"] = form_number(64, label="Output tokens", precision=0, minimum=1)
                form["seed"] = form_number(0, label="Seed", precision=0, minimum=0)
            form["quality"] = gr.Checkbox(
                True,
                label="Quality columns: PPL, KL and top-1 on the quality text (embedded = reference)",
                elem_id="compare-quality",
            )
            start = gr.Button("Compare", variant="primary", elem_id="compare-run")
            message = gr.HTML(elem_id="compare-message")
            files = gr.File(label="Report (JSON, standalone HTML)", file_count="multiple")
        with gr.Column(scale=3):
            throughput = gr.Plot(label="Throughput over time", elem_id="compare-throughput")
            latency = gr.Plot(label="Latency distributions", elem_id="compare-latency")
            kv = gr.Plot(label="KV usage over time", elem_id="compare-kv")

    def on_run(data: dict, progress: gr.Progress = gr.Progress()) -> tuple:  # noqa: B008 (Gradio's idiom)
        return run(ctx, form_values(form, data), progress=progress)

    start.click(
        on_run, set(form.values()), [message, table, throughput, latency, kv, files], concurrency_limit=1
    )
