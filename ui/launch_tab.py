"""Launch tab: load the embedded engine (settings in vLLM's names) with progress; status, stop, relaunch."""

from __future__ import annotations

import functools
import html
from pathlib import Path
from typing import Any

import gradio as gr

from ui import external
from ui.common import (
    AppContext,
    describe,
    error_message,
    gib,
    info_message,
    ok_message,
    optional_int,
    required_int,
)
from ui.state import EngineHolder, LaunchConfig

MIB = 1024**2
DEFAULT_KV_MIB = 256  # small on purpose: a few concurrent chats already show on the KV-cache chart
DTYPES = ["auto", "bfloat16", "float32", "float16"]
PLAN_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def launch_config(
    model,
    dtype,
    device,
    block_size,
    max_num_seqs,
    max_num_batched_tokens,
    max_model_len,
    kv_budget_mib,
    prefix_caching,
    seed,
    trust_remote_code,
) -> LaunchConfig:
    """The form as a LaunchConfig; ValueError naming the field for an impossible value."""
    if not (model or "").strip():
        raise ValueError("model is required: a local folder, a .gguf file or a Hub id")
    kv_mib = optional_int(kv_budget_mib, "KV cache budget (MiB)")
    return LaunchConfig(
        model=model.strip(),
        dtype=dtype,
        device=device,
        block_size=required_int(block_size, "block_size"),
        max_num_seqs=required_int(max_num_seqs, "max_num_seqs"),
        max_num_batched_tokens=required_int(max_num_batched_tokens, "max_num_batched_tokens"),
        max_model_len=optional_int(max_model_len, "max_model_len"),
        kv_cache_memory_bytes=None if kv_mib is None else kv_mib * MIB,
        enable_prefix_caching=bool(prefix_caching),
        seed=required_int(seed, "seed", minimum=0),
        trust_remote_code=bool(trust_remote_code),
    )


@functools.cache
def planned_memory(model: str, dtype: str) -> dict[str, Any]:
    """The planner's weights and KV-per-token figures for a launched model ({} when it cannot say)."""
    from backend.planner import PlanRequest, estimate

    quant = {"torch.bfloat16": "bf16", "bfloat16": "bf16", "torch.float16": "fp16", "float16": "fp16"}
    try:
        req = PlanRequest(model=model, gpu="CPU", engine="embedded", quant=quant.get(dtype, "fp32"))
        return estimate(req).to_dict()
    except (ValueError, OSError):  # a model the planner cannot read (e.g. the Hub when offline)
        return {}


def kib(nbytes: float | None) -> str:
    return "–" if nbytes is None else f"{nbytes / 1024:,.1f} KiB"


def status_html(holder: EngineHolder) -> str:
    status = holder.status()
    name = html.escape(status.config.model if status.config else "")
    if status.state == "stopped":
        return "<div class='msg msg-info' id='engine-state' data-state='stopped'>Stopped: press Launch.</div>"
    if status.state == "loading":
        return (
            f"<div class='msg msg-info' id='engine-state' data-state='loading'>Loading {name} … "
            f"{status.load_seconds:.0f} s</div>"
        )
    if status.state == "failed":
        return (
            f"<div class='msg msg-error' id='engine-state' data-state='failed'>Load failed: "
            f"{html.escape(status.error)}<br>Fix the settings and press Launch again.</div>"
        )
    stats = holder.stats() or {}
    plan = planned_memory(status.config.model, stats.get("dtype", ""))
    kv_tokens = stats["num_kv_blocks_total"] * stats["block_size"]
    cells = [
        ("Model", stats.get("model", name)),
        ("Device · dtype", f"{stats.get('device')} · {stats.get('dtype')}"),
        (
            "KV blocks",
            f"{stats.get('num_kv_blocks_used', 0):,} / {stats.get('num_kv_blocks_total', 0):,} used "
            f"({stats.get('block_size')} tokens each)",
        ),
        ("max_model_len", f"{stats.get('max_model_len', 0):,} tokens"),
        ("Weights (plan)", f"{gib(stats['weights_bytes'])} ({gib(plan.get('weights_bytes'))})"),
        ("KV cache pool", f"{gib(stats['kv_pool_bytes'])} = {kv_tokens:,} tokens"),
        (
            "KV per token (plan)",
            f"{stats['kv_pool_bytes'] / kv_tokens / 1024:,.1f} KiB ({kib(plan.get('kv_bytes_per_token'))})",
        ),
        ("Process memory (RSS)", gib(stats.get("rss_bytes"))),
        ("Loaded in", f"{status.load_seconds:.1f} s"),
    ]
    body = "".join(f"<div class='kpi'><span>{k}</span><b>{html.escape(str(v))}</b></div>" for k, v in cells)
    return f"<div id='engine-state' data-state='ready'><div class='kpis'>{body}</div></div>"


def launch_engine(holder: EngineHolder, *form: Any, progress: Any = None) -> tuple[str, str]:
    """(message, status). Loads in this thread; a bad form value or a failed load becomes the message."""
    try:
        config = launch_config(*form)
    except ValueError as exc:
        return error_message(describe(exc)), status_html(holder)
    if progress is not None:
        progress(0.0, desc=f"Loading {Path(config.model).name} (the default model takes about 20 s)")
    try:
        status = holder.launch(config)
    except RuntimeError as exc:  # another tab is loading
        return error_message(str(exc)), status_html(holder)
    if status.state == "failed":
        return error_message(f"Launch failed: {status.error}"), status_html(holder)
    return ok_message(f"Engine ready in {status.load_seconds:.1f} s — open the Chat tab."), status_html(
        holder
    )


def stop_engine(holder: EngineHolder) -> tuple[str, str]:
    try:
        holder.stop()
    except RuntimeError as exc:
        return error_message(str(exc)), status_html(holder)
    return ok_message("Engine stopped; its memory is released."), status_html(holder)


def settings_from_plan(plan: dict[str, Any] | None) -> tuple:
    """Copy what applies to the embedded engine from the Plan tab (model only if it is a local file)."""
    if not plan:
        return (gr.skip(),) * 7 + (error_message("no plan yet: fill in the Plan tab first"),)
    local = Path(plan["model"]).exists()
    message = (
        "Copied block_size, max_num_seqs, max_num_batched_tokens, max_model_len, dtype and prefix "
        f"caching from the plan{' and its local model' if local else ''}."
    )
    return (
        plan["model"] if local else gr.skip(),
        PLAN_DTYPES.get(plan["quant"], "auto"),
        plan["block_size"],
        plan["max_num_seqs"],
        plan["max_num_batched_tokens"],
        plan["max_model_len"],
        plan["enable_prefix_caching"],
        ok_message(message),
    )


def build(ctx: AppContext, demo: gr.Blocks, plan_state: gr.State) -> None:
    holder = ctx.holder
    with gr.Row():
        with gr.Column(scale=2):
            model = gr.Textbox(ctx.default_model, label="Model", info="local folder, .gguf file or Hub id")
            with gr.Row():
                dtype = gr.Dropdown(
                    DTYPES, value="auto", label="dtype", info="auto = bf16 where fast, else fp32"
                )
                device = gr.Dropdown(["auto", "cpu", "cuda"], value="auto", label="device")
                seed = gr.Number(0, label="seed", precision=0)
            with gr.Row():
                block_size = gr.Number(16, label="block_size (tokens per KV block)", precision=0)
                max_num_seqs = gr.Number(64, label="max_num_seqs", precision=0)
                max_batched = gr.Number(512, label="max_num_batched_tokens", precision=0)
            with gr.Row():
                max_len = gr.Number(0, label="max_model_len (0 = model limit)", precision=0)
                kv_mib = gr.Number(
                    DEFAULT_KV_MIB,
                    label="KV cache budget (MiB, 0 = automatic)",
                    precision=0,
                    info="small by default so that load shows on the KV chart",
                )
            with gr.Row():
                prefix = gr.Checkbox(True, label="enable_prefix_caching")
                remote = gr.Checkbox(False, label="trust_remote_code (runs the model repo's code)")
            with gr.Row():
                from_plan = gr.Button("Copy settings from Plan")
                launch = gr.Button("Launch", variant="primary", elem_id="launch-button")
                stop = gr.Button("Stop", variant="stop", elem_id="stop-button")
            message = gr.HTML(
                info_message("Launch loads the model with these settings."),
                elem_id="launch-message",
                min_height=70,  # room for the progress bar while loading
            )
        with gr.Column(scale=3):
            status = gr.HTML(status_html(holder), elem_id="launch-status")
            with gr.Accordion("External engines (vLLM, SGLang, llama.cpp)", open=False):
                external.build(plan_state)
    form = [
        model,
        dtype,
        device,
        block_size,
        max_num_seqs,
        max_batched,
        max_len,
        kv_mib,
        prefix,
        seed,
        remote,
    ]

    def on_launch(*values: Any, progress: gr.Progress = gr.Progress(track_tqdm=True)) -> str:  # noqa: B008
        return launch_engine(holder, *values, progress=progress)[0]  # the status refreshes right after

    launch.click(on_launch, form, message, concurrency_limit=None).then(
        lambda: status_html(holder), None, status
    )
    stop.click(lambda: stop_engine(holder), None, [message, status])
    from_plan.click(
        settings_from_plan,
        plan_state,
        [model, dtype, block_size, max_num_seqs, max_batched, max_len, prefix, message],
    )
    timer = gr.Timer(2.0)  # another tab may launch or stop the shared engine: keep this view current
    timer.tick(lambda: status_html(holder), None, status, show_progress="hidden")
    demo.load(lambda: status_html(holder), None, status)
