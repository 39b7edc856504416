"""Plan tab: model, quantization, GPUs and workload in; memory, fit, speed and cost out (backend.planner)."""

from __future__ import annotations

import contextlib
import html
from dataclasses import dataclass
from typing import Any

import gradio as gr

from backend.default_model import shown_name
from backend.engines import ENGINES
from backend.planner.request import PlanRequest
from backend.planner.sources import anonymous_hub
from backend.planner.vllm_rules import VLLM_TARGET_VERSION
from backend.planner.vllm_versions import version_choices
from ui import charts
from ui.common import (
    AppContext,
    describe,
    error_message,
    form_values,
    gib,
    info_message,
    message,
    ms,
    optional_int,
    required_float,
    required_int,
    tok_s,
    usd_per_m,
)
from ui.inputs import form_number, form_slider

DEFAULT_PRESET = "meta-llama/Llama-3.1-8B-Instruct"
MAX_QUERY_CHARS = 200  # a Hub search query; the Hub matches names, far shorter


def plan_request(form: dict[str, Any]) -> PlanRequest:
    """The form (field name -> value) as a PlanRequest; ValueError naming the field for anything the
    form cannot hold. 0 (what Gradio sends for an empty number) means automatic."""
    model = str(form["model"] or "").strip()
    if not model:
        raise ValueError("model is required: a preset, a Hub id, a local folder or a .gguf file")
    return PlanRequest(
        model=model,
        gpu=form["gpu"],
        num_gpus=required_int(form["num_gpus"], "number of GPUs"),
        tp=optional_int(form["tp"], "tensor parallel size"),
        pp=required_int(form["pp"], "pipeline parallel size"),
        quant=form["quant"],
        kv_cache_dtype=form["kv_dtype"],
        max_model_len=optional_int(form["max_len"], "max_model_len"),
        input_len=required_int(form["input_len"], "input length (tokens)"),
        output_len=required_int(form["output_len"], "output length (tokens)"),
        concurrency=required_int(form["concurrency"], "concurrency"),
        gpu_memory_utilization=required_float(form["util"], "gpu_memory_utilization", note=" in (0, 1]"),
        engine=form["engine"],
        vllm_version=str(form.get("vllm_version") or "").strip() or None,
    )


def concurrency_kpi(est: dict[str, Any]) -> str:
    """A plan that does not start has no concurrency: show what the first suggested fix gives instead."""
    if est["fits"]:
        return f"{est['max_concurrency']:,} requests"
    after = est.get("max_concurrency_after_fix")
    return "does not start" if after is None else f"does not start · {after:,} after the first fix"


def kpi_html(est: dict[str, Any]) -> str:
    cells = [
        ("KV cache", f"{gib(est['kv_cache_bytes'])} · {est['kv_cache_tokens']:,} tokens"),
        ("Max concurrency", concurrency_kpi(est)),
        ("Longest single request", f"{est['max_model_len_single']:,} tokens"),
        ("Prefill", tok_s(est["prefill_tokens_per_s"])),
        ("Time to first token", ms(est["ttft_s"])),
        ("Decode per request", tok_s(est["decode_tokens_per_s_per_seq"])),
        ("Decode, all requests", tok_s(est["decode_tokens_per_s_total"])),
        ("Cost, output", usd_per_m(est["cost_per_million_output_tokens"])),
        ("Cost, input", usd_per_m(est.get("cost_per_million_input_tokens"))),
        ("Memory per GPU", f"{gib(est['total_bytes_per_gpu'])} of {gib(est.get('gpu_memory_bytes'))}"),
    ]
    body = "".join(f"<div class='kpi'><span>{name}</span><b>{value}</b></div>" for name, value in cells)
    return f"<div class='kpis' id='plan-kpi-grid'>{body}</div>" + terms_html(est)


def terms_html(est: dict[str, Any]) -> str:
    """Each memory term beside how the engine computes it (Estimate.memory_terms); '-' marks the terms
    taken out of the budget."""
    family = f" (vLLM {html.escape(est['vllm_family'])})" if est.get("vllm_family") else ""
    rows = "".join(
        f"<tr><td>{'−' if t['subtracted'] else ''}</td><td>{html.escape(t['name'])}</td>"
        f"<td>{gib(t['bytes'])}</td><td>{html.escape(t['how'])}</td></tr>"
        for t in est.get("memory_terms", [])
    )
    return (
        f"<details id='plan-memory-terms' open><summary>Where the memory goes{family}</summary>"
        f"<table><tr><th></th><th>term</th><th>per GPU</th><th>how</th></tr>{rows}</table></details>"
    )


def badge_html(est: dict[str, Any]) -> str:
    if est["fits"]:
        badge = "<span class='badge badge-fits'>✓ Fits</span>"
    else:
        badge = "<span class='badge badge-nofit'>✗ Does not fit</span>"
    badge += f" <span id='plan-fit-reason'>{html.escape(est['fit_reason'])}</span>"
    notes = [*est.get("fixes", []), *est.get("warnings", [])]
    return badge + "".join(message("info", n) for n in notes)


def estimate_plan(form: dict[str, Any], ctx: AppContext | None = None) -> tuple:
    """Handler for every input change; with ctx, its policy decides which models a visitor may name.

    Returns (badge, kpis, memory figure, GPU comparison, recommendation, message, plan as a dict)."""
    from backend.planner import Targets, compare_gpus, estimate, recommendation

    public = ctx is not None and ctx.policy.is_public
    try:
        name = str(form["model"] or "").strip()
        if ctx is not None and name:  # public mode: presets, the app's own model and Hub ids, never a path
            ctx.policy.check_model_name(name, presets=(ctx.default_model,))
        req = plan_request(form)
        # a visitor's pick is read from the Hub as anyone would read it: without the owner's HF_TOKEN
        with anonymous_hub() if public else contextlib.nullcontext():
            est = estimate(req).to_dict()
            rows = [e.to_dict() for e in compare_gpus(req)]
            ttft_s = _seconds(form["ttft"], "target TTFT (ms)")
            advice = recommendation(req, Targets(ttft_s, _seconds(form["tpot"], "target TPOT (ms)")))
    # every planner error (unknown model or GPU, lengths beyond the model's limit) becomes the message
    except Exception as exc:
        return (*(gr.skip(),) * 5, error_message(describe(exc)), gr.skip())
    return (
        badge_html(est),
        kpi_html(est),
        charts.memory_figure(est, req.gpu),
        charts.gpu_compare_figure(rows),
        recommendation_text(advice),
        "",
        req.to_dict(),
    )


def recommendation_text(advice: Any) -> str:
    """The Recommendation as one line; it names its quantization against the plan's (the chart's)."""
    best = advice.best
    if best is None:
        return (
            "**Recommendation:** no catalog GPU meets these targets; relax the TTFT/TPOT targets or quantize."
        )
    b = best.to_dict()
    if advice.changes_quant:
        quant = f"**{b['quant']} instead of the plan's {advice.plan_quant}** ({advice.reason()})"
    else:
        quant = f"{b['quant']} (the plan's quantization, as in the chart)"
    return (
        f"**Recommendation** (cheapest that fits the workload and targets): "
        f"{b['num_gpus']} × {b['gpu']}, {quant} — "
        f"{tok_s(b['decode_tokens_per_s_total'])}, {usd_per_m(b['cost_per_million_output_tokens'])}"
    )


def _seconds(milliseconds: float | None, name: str) -> float | None:
    """A latency target from the form (ms) in seconds; 0 means no target."""
    value = required_float(milliseconds, name, minimum=0, note=" (0 = no target)")
    return None if value == 0 else value / 1000


def hub_status() -> tuple:
    """(badge, search box, search button): Hub search only where the Hub answers."""
    from backend.default_model import hub_reachable

    if hub_reachable(timeout=2.0):
        return (
            "<span class='badge badge-online'>Hub online: search models by name</span>",
            gr.skip(),
            gr.skip(),
        )
    badge = (
        "<span class='badge badge-offline'>Offline: the Hugging Face Hub is unreachable</span> "
        "presets, local model folders and .gguf files still work"
    )
    off = "Hub unreachable: pick a preset or type a local path in Model"
    return badge, gr.update(interactive=False, placeholder=off), gr.update(interactive=False)


def search_hub(query: str, anonymous: bool = False):
    """Model ids on the Hub matching query (text-generation), as new dropdown choices; ``anonymous``
    (a public app) sends no token, so a visitor sees what anyone sees."""
    from huggingface_hub import HfApi

    query = (query or "").strip()[:MAX_QUERY_CHARS]
    if not query:
        return gr.skip(), error_message("type part of a model name to search, e.g. 'qwen2.5 7b'")
    try:
        api = HfApi(token=False) if anonymous else HfApi()
        ids = [m.id for m in api.list_models(search=query, pipeline_tag="text-generation", limit=25)]
    except Exception as exc:  # offline or Hub error
        return gr.skip(), error_message(f"Hub search failed ({describe(exc)}); type a local path or a preset")
    if not ids:
        return gr.skip(), info_message(f"no text-generation model matches {query!r}")
    return gr.update(choices=ids, value=ids[0]), info_message(f"{len(ids)} models found; pick one")


def checkpoint_hint(model: str, quant: str):
    """The checkpoint field's placeholder: the usual name of the model in this quantization."""
    from backend.export.plan import suggest_checkpoint

    suggestion = suggest_checkpoint((model or "").strip(), quant or "auto")
    return gr.update(placeholder=f"e.g. {suggestion}" if suggestion else "not needed for these weights")


def with_checkpoint(plan: dict[str, Any] | None, checkpoint: str) -> dict[str, Any] | None:
    """The plan state with the quantized checkpoint the export should serve (None: the model itself)."""
    return {**plan, "checkpoint": (checkpoint or "").strip() or None} if plan else plan


def quality_view(model: str, ctx: AppContext | None = None) -> str:
    """The measured-quality panel for the model: its cached figures, or how to get them; with ctx, its
    policy decides which models a visitor may name (no paths in public mode)."""
    from backend.quality.plan_figures import view

    name = str(model or "").strip()
    try:
        if ctx is not None:
            ctx.policy.check_model_name(name, presets=(ctx.default_model,))
        return view(name)
    except Exception as exc:  # a refused name, an unreadable model folder or cache: say so, keep the tab
        return f"Measured quality: {describe(exc)}"


def measure_quality(model: str, progress: Any = None, ctx: AppContext | None = None) -> str:
    """Run the measurement for a local model (cached), then show it; never for a public app's visitors
    (it runs models on the host), whose button is hidden."""
    from backend.quality.plan_figures import measure, table_markdown

    if ctx is not None and ctx.policy.is_public:
        return "Measured quality: a public app shows cached figures only; measuring runs on the owner's side."

    def report(done: int, total: int, label: str) -> None:
        if progress is not None:
            progress(done / max(total, 1), desc=f"{label}: {done}/{total} chunks")

    try:
        return table_markdown(measure(str(model or "").strip(), report))
    except Exception as exc:  # a model the engine cannot load, a bad spec: the message, not a crash
        return f"Measured quality failed: {describe(exc)}"


def quality_panel(ctx: AppContext, model: gr.Dropdown) -> tuple[gr.Markdown, Any]:
    """Measured quality of the quantizations the engine offers for a local model (backend/quality)."""
    with gr.Accordion("Measured quality on this machine (local models)", open=True, elem_id="plan-quality"):
        table = gr.Markdown(elem_id="plan-quality-table")
        if not ctx.policy.is_public:  # measuring runs models on the host: not even wired on a public app
            run = gr.Button("Measure quality", elem_id="plan-quality-run")

            def on_measure(name: str, progress: gr.Progress = gr.Progress()) -> str:  # noqa: B008 (Gradio)
                return measure_quality(name, progress, ctx)

            run.click(on_measure, model, table, concurrency_limit=1)

    def on_view(name: str) -> str:
        return quality_view(name, ctx)

    model.change(on_view, model, table, show_progress="hidden")
    return table, on_view


@dataclass(slots=True)
class PlanPanel:
    """What the app wires to other tabs: the plan state and the "Launch this plan here" controls."""

    plan_state: gr.State
    launch_here: gr.Button
    verdict: gr.HTML
    alternative: gr.Button


def model_choices(ctx: AppContext, presets: list[str]) -> list[str]:
    """The presets and the app's own model by the name that plans it (the default model's Hub id, not its
    bundled file's path); a public app's local model is left out, as its only name there is no path."""
    own = [ctx.shown_model] if ctx.shown_model == shown_name(ctx.default_model) else []
    return list(dict.fromkeys([*presets, *own]))


def build(ctx: AppContext, demo: gr.Blocks) -> PlanPanel:
    """The Plan tab; its state holds the last valid PlanRequest (as a dict) for other tabs."""
    from backend.planner import list_gpus, list_kv_cache_dtypes, list_presets, list_quantizations

    plan_state = gr.State(None)
    public = ctx.policy.is_public
    with gr.Row():
        with gr.Column(scale=2, elem_id="plan-form"):
            hub = gr.HTML(elem_id="hub-badge")
            form: dict[str, Any] = {
                "model": gr.Dropdown(
                    model_choices(ctx, list_presets()),
                    value=DEFAULT_PRESET,
                    label="Model",
                    allow_custom_value=True,
                    info="a preset, a Hub id, a local model folder or a .gguf file",
                    elem_id="plan-model",
                )
            }
            with gr.Row():
                query = gr.Textbox(label="Search the Hub", placeholder="e.g. llama 3.1 8b", scale=3)
                search = gr.Button("Search", scale=1)
            with gr.Row():
                form["quant"] = gr.Dropdown(
                    ["auto", *list_quantizations()], value="auto", label="Weights (auto = as stored)"
                )
                form["kv_dtype"] = gr.Dropdown(list_kv_cache_dtypes(), value="auto", label="KV cache dtype")
            checkpoint = None
            if not public:  # a path on this machine: not even registered on a public app
                checkpoint = gr.Textbox(
                    label="Quantized checkpoint (for the export)",
                    info="the Hub id or path holding weights in this quantization; empty = the model itself",
                    elem_id="plan-checkpoint",
                )
            with gr.Row():
                form["gpu"] = gr.Dropdown(
                    list_gpus(),
                    value="H100-80GB",
                    label="GPU",
                    allow_custom_value=True,
                    elem_id="plan-gpu",
                    scale=2,
                )
                form["num_gpus"] = form_number(
                    1, label="GPUs", precision=0, minimum=1, elem_id="plan-num-gpus"
                )
                form["tp"] = form_number(0, label="Tensor parallel (0 = all GPUs)", precision=0, minimum=0)
                form["pp"] = form_number(1, label="Pipeline parallel", precision=0, minimum=1)
            with gr.Row():
                form["max_len"] = form_number(
                    0, label="max_model_len (0 = model limit)", precision=0, minimum=0
                )
                form["input_len"] = form_number(1024, label="Input tokens / request", precision=0, minimum=1)
                form["output_len"] = form_number(256, label="Output tokens / request", precision=0, minimum=1)
                form["concurrency"] = form_number(16, label="Concurrent requests", precision=0, minimum=1)
            with gr.Row():
                form["util"] = form_slider(0.5, 1.0, value=0.92, step=0.01, label="gpu_memory_utilization")
                form["engine"] = gr.Dropdown(list(ENGINES), value="vllm", label="Serving engine")
                form["vllm_version"] = gr.Dropdown(
                    version_choices(VLLM_TARGET_VERSION),
                    value=VLLM_TARGET_VERSION,
                    label="vLLM version (its defaults and accounting)",
                    allow_custom_value=True,
                    elem_id="plan-vllm-version",
                )
            with gr.Row():
                form["ttft"] = form_number(0, label="Target TTFT (ms, 0 = none)", minimum=0)
                form["tpot"] = form_number(0, label="Target time per output token (ms, 0 = none)", minimum=0)
            message_box = gr.HTML(elem_id="plan-message")
            with gr.Row():
                launch_here = gr.Button(
                    "Launch this plan here",
                    variant="primary",
                    elem_id="plan-launch-here",
                    visible=not public,  # visitors of a public app do not launch engines (nor is it wired)
                )
                alternative = gr.Button(
                    "Launch the suggestion instead", visible=False, elem_id="plan-alternative"
                )
            verdict = gr.HTML(elem_id="plan-verdict")
        with gr.Column(scale=3, elem_id="plan-result"):
            badge = gr.HTML(elem_id="plan-badge")
            kpis = gr.HTML(elem_id="plan-kpis")
            memory = gr.Plot(label="Memory per GPU", elem_id="plan-memory")
    compare = gr.Plot(label="GPU comparison", elem_id="plan-compare")
    recommendation = gr.Markdown(elem_id="plan-recommendation")
    quality, on_view = quality_panel(ctx, form["model"])

    outputs = [badge, kpis, memory, compare, recommendation, message_box, plan_state]

    def on_change(data: dict) -> tuple:
        return estimate_plan(form_values(form, data), ctx=ctx)

    for control in form.values():
        event = control.change(on_change, set(form.values()), outputs, show_progress="hidden")
        if checkpoint is not None:
            event.then(with_checkpoint, [plan_state, checkpoint], plan_state)
    if checkpoint is not None:
        checkpoint.change(with_checkpoint, [plan_state, checkpoint], plan_state)
        for control in (form["model"], form["quant"]):
            control.change(
                checkpoint_hint, [form["model"], form["quant"]], checkpoint, show_progress="hidden"
            )
    search.click(lambda text: search_hub(text, anonymous=public), query, [form["model"], message_box])
    demo.load(on_change, set(form.values()), outputs).then(hub_status, None, [hub, query, search]).then(
        on_view, form["model"], quality, show_progress="hidden"
    )
    return PlanPanel(plan_state, launch_here, verdict, alternative)
