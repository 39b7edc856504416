"""Launch tab: load the embedded engine (settings in vLLM's names) with progress; status, stop, relaunch."""

from __future__ import annotations

import contextlib
import functools
import html
from collections.abc import Callable
from dataclasses import Field, fields
from pathlib import Path
from typing import Any

import gradio as gr

from backend.engine.config import EngineConfig, cli_types, config_field, speculative_model
from backend.engine.stats import EngineStats
from backend.server.engine_holder import EngineHolder, EngineState
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

MIB = 1024**2
DEFAULT_KV_MIB = 256  # small on purpose: a few concurrent chats already show on the KV-cache chart
PLAN_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# Where the form differs from an EngineConfig field (everything else comes from the field and its metadata)
FORM_LABELS = {"kv_cache_memory_bytes": "kv_cache_memory (MiB)"}
FORM_SCALE = {"kv_cache_memory_bytes": MIB}  # the form takes MiB
FORM_DEFAULTS = {"kv_cache_memory_bytes": DEFAULT_KV_MIB}


def engine_fields() -> list[Field]:
    """The Launch form's engine knobs: every EngineConfig field except the model."""
    return [f for f in fields(EngineConfig) if f.name != "model"]


def form_defaults() -> dict[str, Any]:
    """What the Launch form shows before the user edits it (field name -> value, the model left out)."""
    return {f.name: FORM_DEFAULTS.get(f.name, f.default) for f in engine_fields()}


def launch_config(form: dict[str, Any]) -> EngineConfig:
    """The form (field name -> value) as an EngineConfig; ValueError naming the field for a bad value."""
    model = (form.get("model") or "").strip()
    if not model:
        raise ValueError("model is required: a local folder, a .gguf file or a Hub id")
    values: dict[str, Any] = {}
    for f in engine_fields():
        value, kind = form[f.name], cli_types()[f.name]
        if kind is int:
            label = FORM_LABELS.get(f.name, f.name)
            if f.default is None:
                number = optional_int(value, label, minimum=f.metadata["minimum"])
            else:
                number = required_int(value, label, minimum=f.metadata["minimum"])
            value = None if number is None else number * FORM_SCALE.get(f.name, 1)
        elif kind is bool:
            value = bool(value)
        elif f.default is None:  # an optional text field: empty means unset
            value = (value or "").strip() or None
        values[f.name] = value
    return EngineConfig(model=model, **values)


def engine_input(f: Field, visible: bool = True) -> gr.components.Component:
    """The form input for one EngineConfig field, built from its type and metadata."""
    label, info = FORM_LABELS.get(f.name, f.name), f.metadata["help"]
    value = form_defaults()[f.name]
    if cli_types()[f.name] is bool:
        return gr.Checkbox(value, label=label, info=info, visible=visible)
    if f.metadata["choices"]:
        return gr.Dropdown(list(f.metadata["choices"]), value=value, label=label, info=info)
    if cli_types()[f.name] is str:
        return gr.Textbox(value or "", label=label, info=info, placeholder="unset")
    return gr.Number(value, label=label, info=info, precision=0)


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
    stats = holder.stats() if status.state == EngineState.READY else None
    if status.state == EngineState.STOPPED or (status.state == EngineState.READY and stats is None):
        return "<div class='msg msg-info' id='engine-state' data-state='stopped'>Stopped: press Launch.</div>"
    if status.state == EngineState.LOADING:
        serving = status.serving.model if status.serving else ""
        keeps = f" ({html.escape(serving)} keeps serving until it is ready)" if serving else ""
        return (
            f"<div class='msg msg-info' id='engine-state' data-state='loading'>Loading {name} … "
            f"{status.load_seconds:.0f} s{keeps}</div>"
        )
    if status.state == EngineState.FAILED:
        return (
            f"<div class='msg msg-error' id='engine-state' data-state='failed'>Load failed: "
            f"{html.escape(status.error)}<br>Fix the settings and press Launch again.</div>"
        )
    assert stats is not None and status.config is not None  # READY with an engine
    plan = planned_memory(status.config.model, stats.dtype)
    kv_tokens = stats.num_kv_blocks_total * stats.block_size
    cells = [
        ("Model", stats.model),
        ("Device · dtype", f"{stats.device} · {stats.dtype}"),
        (
            "KV blocks",
            f"{stats.num_kv_blocks_used:,} / {stats.num_kv_blocks_total:,} used "
            f"({stats.block_size} tokens each)",
        ),
        ("max_model_len", f"{stats.max_model_len:,} tokens"),
        ("Weights (plan)", f"{gib(stats.weights_bytes)} ({gib(plan.get('weights_bytes'))})"),
        ("KV cache pool", f"{gib(stats.kv_pool_bytes)} = {kv_tokens:,} tokens"),
        (
            "KV per token (plan)",
            f"{stats.kv_pool_bytes / kv_tokens / 1024:,.1f} KiB ({kib(plan.get('kv_bytes_per_token'))})",
        ),
        ("Process memory (RSS)", gib(stats.rss_bytes)),
        ("Speculative decoding", speculation_summary(stats)),
        ("Loaded in", f"{status.load_seconds:.1f} s"),
    ]
    body = "".join(f"<div class='kpi'><span>{k}</span><b>{html.escape(str(v))}</b></div>" for k, v in cells)
    failed = (
        error_message(f"The last launch failed ({status.error}); the engine below keeps serving.")
        if status.error
        else ""
    )
    return f"<div id='engine-state' data-state='ready'>{failed}<div class='kpis'>{body}</div></div>"


def launch_engine(
    holder: EngineHolder,
    form: dict[str, Any],
    progress: Any = None,
    authorize: Callable[[EngineConfig], None] | None = None,
) -> tuple[str, str]:
    """(message, status). Loads in this thread; a bad form value, a refusal by ``authorize`` (public
    mode) or a failed load becomes the message, and a failed load leaves the running engine serving."""
    try:
        config = launch_config(form)
        if authorize is not None:
            authorize(config)
    except ValueError as exc:
        return error_message(describe(exc)), status_html(holder)
    if progress is not None:
        progress(0.0, desc=f"Loading {Path(config.model).name} (the default model takes about 20 s)")
    try:
        status = holder.launch(config)
    except RuntimeError as exc:  # another tab is loading
        return error_message(str(exc)), status_html(holder)
    if status.error:
        still = f"; {status.serving.model} keeps serving" if status.serving else ""
        return error_message(f"Launch failed: {status.error}{still}"), status_html(holder)
    return ok_message(f"Engine ready in {status.load_seconds:.1f} s — open the Chat tab."), status_html(
        holder
    )


def speculation_summary(stats: EngineStats) -> str:
    if stats.speculative_method is None:
        return "off"
    return (
        f"{stats.speculative_method}, k={stats.num_speculative_tokens}: "
        f"{stats.spec_decode_acceptance_rate:.0%} of drafts accepted, "
        f"{stats.spec_decode_mean_acceptance_length:.2f} tokens per step"
    )


def authorize_launch(ctx: AppContext, token: str | None, config: EngineConfig) -> None:
    """Public mode: the admin token first (a visitor learns nothing about models), then no remote code,
    a Hub id or the app's own model, and a download within the size cap."""
    policy = ctx.policy
    policy.check_admin(token)
    policy.check_trust_remote_code(config.trust_remote_code)
    policy.check_model_name(config.model, presets=(ctx.default_model,))
    if policy.is_public and config.model != ctx.default_model:
        policy.check_model_size(config.model)
    draft = speculative_model(config)
    if draft is not None:  # a draft model is a second model to load: the same rules
        policy.check_model_name(draft)
        if policy.is_public:
            policy.check_model_size(draft)


def stop_engine(holder: EngineHolder, authorize: Callable[[], None] | None = None) -> tuple[str, str]:
    try:
        if authorize is not None:
            authorize()
        holder.stop()
    except (ValueError, RuntimeError) as exc:  # not allowed, or still loading
        return error_message(str(exc)), status_html(holder)
    return ok_message("Engine stopped; its memory is released."), status_html(holder)


def default_config(model: str) -> EngineConfig:
    """What the chat (locally) and a public app (at startup) launch: the app's model, a small KV pool."""
    return EngineConfig(model=model, kv_cache_memory_bytes=DEFAULT_KV_MIB * MIB)


def launch_default(ctx: AppContext) -> None:
    with contextlib.suppress(RuntimeError):  # another tab started a launch first; the caller waits for it
        ctx.holder.launch(default_config(ctx.default_model))


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
            inputs = {
                "model": gr.Textbox(
                    ctx.default_model, label="model", info=config_field("model").metadata["help"]
                )
            }
            knobs = [f for f in engine_fields() if cli_types()[f.name] is not bool]
            for row in range(0, len(knobs), 3):
                with gr.Row():
                    inputs.update({f.name: engine_input(f) for f in knobs[row : row + 3]})
            with gr.Row():
                hidden = {"trust_remote_code"} if ctx.policy.is_public else set()  # refused there anyway
                inputs.update(
                    {
                        f.name: engine_input(f, visible=f.name not in hidden)
                        for f in engine_fields()
                        if f not in knobs
                    }
                )
            admin = gr.Textbox(
                label="Admin token (PLAYGROUND_ADMIN_TOKEN): launch and stop need it on this public app",
                type="password",
                visible=ctx.policy.is_public,
                elem_id="admin-token",
            )
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
            if not ctx.policy.is_public:  # starting other programs is for the machine's owner only
                with gr.Accordion("External engines (vLLM, SGLang, llama.cpp)", open=False):
                    external.build(ctx.external, plan_state)

    def on_launch(data: dict, progress: gr.Progress = gr.Progress(track_tqdm=True)) -> str:  # noqa: B008
        form = {name: data[component] for name, component in inputs.items()}
        authorize = functools.partial(authorize_launch, ctx, data[admin])
        # the status refreshes right after
        return launch_engine(holder, form, progress=progress, authorize=authorize)[0]

    def on_stop(token: str | None) -> tuple[str, str]:
        return stop_engine(holder, authorize=functools.partial(ctx.policy.check_admin, token))

    launch.click(
        on_launch, {*inputs.values(), admin}, message, concurrency_limit=None, api_name="launch"
    ).then(lambda: status_html(holder), None, status)
    stop.click(on_stop, admin, [message, status], api_name="stop")
    plan_fields = ["model", "dtype", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"]
    from_plan.click(
        settings_from_plan,
        plan_state,
        [*(inputs[name] for name in plan_fields), inputs["enable_prefix_caching"], message],
    )
    timer = gr.Timer(2.0)  # another tab may launch or stop the shared engine: keep this view current
    timer.tick(lambda: status_html(holder), None, status, show_progress="hidden")
    demo.load(lambda: status_html(holder), None, status)
