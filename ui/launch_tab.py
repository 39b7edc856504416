"""Launch tab: load the embedded engine (settings in vLLM's names) with progress; status, stop, relaunch."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import html
from collections.abc import Callable
from dataclasses import Field, dataclass, fields
from typing import Any

import gradio as gr

from backend.default_model import DEFAULT_HUB_ID, load_name, packaged_gguf, shown_name
from backend.engine.config import EngineConfig, cli_types, config_field, speculative_model
from backend.engine.load_phases import LoadPhase
from backend.engine.stats import EngineStats
from backend.model_names import display_name
from backend.model_support import refuse_unsupported
from backend.server.engine_holder import EngineHolder, EngineState, EngineStatus
from ui import external, launch_summary
from ui.common import (
    AppContext,
    describe,
    error_message,
    gib,
    info_message,
    message,
    ok_message,
    optional_int,
    required_int,
)
from ui.common import form_values as form_values_of
from ui.inputs import form_number

MIB = 1024**2
DEFAULT_KV_MIB = 256  # small on purpose: a few concurrent chats already show on the KV-cache chart
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
    model = load_name(form.get("model") or "")
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
    """The form input for one EngineConfig field, built from its type and metadata. Gradio sends 0 for an
    empty number, so an optional one takes 0 for unset (its help says what that means)."""
    label, info = FORM_LABELS.get(f.name, f.name), f.metadata["help"]
    value = form_defaults()[f.name]
    if cli_types()[f.name] is bool:
        return gr.Checkbox(value, label=label, info=info, visible=visible)
    if f.metadata["choices"]:
        return gr.Dropdown(list(f.metadata["choices"]), value=value, label=label, info=info)
    if cli_types()[f.name] is str:
        return gr.Textbox(value or "", label=label, info=info, placeholder="unset")
    minimum = 0 if f.default is None else f.metadata["minimum"]
    return form_number(value, label=label, info=info, precision=0, minimum=minimum)


def form_values(config: EngineConfig) -> dict[str, Any]:
    """An EngineConfig as the form shows it (field name -> value, model included): launch_config's inverse."""
    values = {f.name: getattr(config, f.name) for f in engine_fields()}
    for name, scale in FORM_SCALE.items():
        values[name] = None if values[name] is None else values[name] // scale
    return {"model": shown_name(config.model), **values}


@functools.cache
def planned_memory(
    model: str,
    dtype: str,
    as_stored: bool = False,
    kv_cache_dtype: str = "auto",
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    enforce_eager: bool = False,
) -> dict[str, Any]:
    """The planner's weights, KV-per-token and decode-graph figures for a launched model ({} when it
    cannot say)."""
    from backend.planner import estimate
    from backend.planner.launch_here import running_engine_request

    try:
        return estimate(
            running_engine_request(
                model, dtype, as_stored, kv_cache_dtype, max_model_len, max_num_seqs, enforce_eager
            )
        ).to_dict()
    except (ValueError, OSError):  # a model the planner cannot read (e.g. the Hub when offline)
        return {}


def kib(nbytes: float | None) -> str:
    return "–" if nbytes is None else f"{nbytes / 1024:,.1f} KiB"


def mib(nbytes: float | None) -> str:
    return "–" if nbytes is None else f"{nbytes / 2**20:,.2f} MiB"


def phases_text(phases: tuple[LoadPhase, ...]) -> str:
    return ", ".join(f"{p.name} {p.seconds:.1f} s" for p in phases)


def status_html(holder: EngineHolder) -> str:
    status = holder.status()
    stats = holder.stats() if status.state == EngineState.READY else None
    if status.state == EngineState.STOPPED or (status.state == EngineState.READY and stats is None):
        return message("info", "Stopped: press Launch.", elem_id="engine-state", data={"state": "stopped"})
    name = display_name(status.config.model) if status.config else ""
    if status.state == EngineState.LOADING:
        serving = (
            f" ({display_name(status.serving.model)} keeps serving until it is ready)"
            if status.serving
            else ""
        )
        text = f"Loading {name} … {status.phase or 'starting'} · {status.load_seconds:.0f} s{serving}"
        return message("info", text, elem_id="engine-state", data={"state": "loading"})
    if status.state == EngineState.FAILED:
        body = f"Load failed: {html.escape(status.error)}<br>Fix the settings and press Launch again."
        return message("error", body_html=body, elem_id="engine-state", data={"state": "failed"})
    assert stats is not None and status.config is not None  # READY with an engine
    return ready_card(status, stats)


def ready_card(status: EngineStatus, stats: EngineStats) -> str:
    assert status.config is not None
    kv_dtype = status.config.kv_cache_dtype
    as_stored = stats.quantization is not None
    config, eager = status.config, stats.decode_graph_bytes == 0  # captured nothing: plan without graphs
    plan = planned_memory(
        config.model, stats.dtype, as_stored, kv_dtype, stats.max_model_len, config.max_num_seqs, eager
    )
    kv_tokens = stats.num_kv_blocks_total * stats.block_size
    cells = [
        ("Model", display_name(status.config.model, stats.quantization, stats.dtype)),
        ("Device · dtype", f"{stats.device} · {stats.dtype}"),
        ("Quantization", stats.quantization or f"none (weights in {stats.dtype})"),
        (
            "KV blocks",
            f"{stats.num_kv_blocks_used:,} / {stats.num_kv_blocks_total:,} used "
            f"({stats.block_size} tokens each)",
        ),
        ("max_model_len", f"{stats.max_model_len:,} tokens"),
        ("Weights (plan)", f"{gib(stats.weights_bytes)} ({gib(plan.get('weights_bytes'))})"),
        ("KV cache pool", f"{gib(stats.kv_pool_bytes)} = {kv_tokens:,} tokens ({kv_dtype})"),
        (
            "KV per token (plan)",
            f"{stats.kv_pool_bytes / kv_tokens / 1024:,.1f} KiB ({kib(plan.get('kv_bytes_per_token'))})",
        ),
        (
            "Decode graph (plan)",
            f"{mib(stats.decode_graph_bytes)} ({mib(plan.get('cuda_graph_bytes'))})"
            if stats.decode_graph_bytes
            else "none (decode steps run the modules)",
        ),
        ("Process memory (RSS)", gib(stats.rss_bytes)),
        ("Speculative decoding", speculation_summary(stats)),
        ("Loaded in", f"{status.load_seconds:.1f} s"),
    ]
    body = "".join(f"<div class='kpi'><span>{k}</span><b>{html.escape(str(v))}</b></div>" for k, v in cells)
    where = f"<div class='phases' id='load-phases'>{html.escape(phases_text(status.phases))}</div>"
    failed = (
        error_message(f"The last launch failed ({status.error}); the engine below keeps serving.")
        if status.error
        else ""
    )
    return f"<div id='engine-state' data-state='ready'>{failed}<div class='kpis'>{body}</div>{where}</div>"


def launch_engine(
    holder: EngineHolder,
    form: dict[str, Any],
    progress: Any = None,
    authorize: Callable[[EngineConfig], None] | None = None,
) -> tuple[str, str]:
    """(message, status). Loads in this thread, each load phase shown on ``progress``; a bad form value,
    a refusal by ``authorize`` (public mode) or a failed load becomes the message, and a failed load
    leaves the running engine serving."""
    try:
        config = launch_config(form)
        if authorize is not None:
            authorize(config)
        refuse_unsupported(config.model, speculative_model(config))
    except ValueError as exc:  # a bad value, refused, or an architecture the engine cannot run
        return error_message(describe(exc)), status_html(holder)
    name = display_name(config.model)
    # gr.Progress finds its event through context variables, and every phase after the first begins on the
    # engine's own loading thread: run the update in this handler's context, or the label would stay on the
    # first phase for the whole load
    handler_context = contextvars.copy_context()

    def on_phase(phase: str, fraction: float) -> None:
        if progress is not None:
            handler_context.run(progress, fraction, desc=f"{name}: {phase} …")

    try:
        status = holder.launch(config, on_phase=on_phase)
    except RuntimeError as exc:  # another tab is loading
        return error_message(str(exc)), status_html(holder)
    if status.error:
        still = f"; {display_name(status.serving.model)} keeps serving" if status.serving else ""
        return error_message(f"Launch failed: {status.error}{still}"), status_html(holder)
    phases = phases_text(status.phases)
    ready = f"Engine ready in {status.load_seconds:.1f} s: {name} ({phases}). Open the Chat tab."
    return ok_message(ready), status_html(holder)


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
    bundled = packaged_gguf()  # what the default model's Hub id loads (load_name): no download
    own = (ctx.default_model, *([str(bundled)] if bundled is not None else []))
    policy.check_model_name(config.model, presets=own)
    if policy.is_public and config.model not in own:
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


def model_help() -> str:
    """The model box's help: the engine's, and what the default model's Hub id loads here."""
    text = config_field("model").metadata["help"]
    bundled = packaged_gguf()
    if bundled is None:
        return text
    kind = display_name(str(bundled)).split(" · ")[-1]  # "GGUF Q4_1"
    return f"{text}; {DEFAULT_HUB_ID} runs from its bundled {kind} file (no download)"


def default_config(model: str) -> EngineConfig:
    """What the chat (locally) and a public app (at startup) launch: the app's model, a small KV pool."""
    return EngineConfig(model=model, kv_cache_memory_bytes=DEFAULT_KV_MIB * MIB)


def launch_default(ctx: AppContext) -> None:
    with contextlib.suppress(RuntimeError):  # another tab started a launch first; the caller waits for it
        ctx.holder.launch(default_config(ctx.default_model))


def engine_inputs(is_public: bool) -> dict[str, gr.components.Component]:
    """The engine's knobs, EngineConfig's fields in vLLM's names: three a row with the full names readable
    (CSS in ui/app.py wraps them on narrower screens), then the switches two a row, help beside each."""
    inputs = {}
    knobs = [f for f in engine_fields() if cli_types()[f.name] is not bool]
    for row in range(0, len(knobs), 3):
        with gr.Row():
            inputs.update({f.name: engine_input(f) for f in knobs[row : row + 3]})
    hidden = {"trust_remote_code"} if is_public else set()  # refused there anyway
    switches = [f for f in engine_fields() if f not in knobs]
    for row in range(0, len(switches), 2):
        with gr.Row():
            for f in switches[row : row + 2]:
                inputs[f.name] = engine_input(f, visible=f.name not in hidden)
    return inputs


@dataclass(slots=True)
class LaunchPanel:
    """What other tabs drive (Plan's "Launch this plan here"): the form, its messages, and the launch."""

    inputs: dict[str, gr.components.Component]
    admin: gr.Textbox
    message: gr.HTML
    status: gr.HTML
    on_launch: Callable[..., str]


def build(ctx: AppContext, demo: gr.Blocks, plan_state: gr.State) -> LaunchPanel:
    holder = ctx.holder
    with gr.Row():
        # first what a newcomer needs: the model, what will run, the button; the engine's knobs folded below
        with gr.Column(scale=5, elem_id="launch-form"):
            inputs = {"model": gr.Textbox(ctx.shown_model, label="model", info=model_help())}
            summary = launch_summary.build()
            admin = gr.Textbox(
                label="Admin token (PLAYGROUND_ADMIN_TOKEN): launch and stop need it on this public app",
                type="password",
                visible=ctx.policy.is_public,
                elem_id="admin-token",
            )
            with gr.Row():
                launch = gr.Button("Launch", variant="primary", elem_id="launch-button")
                stop = gr.Button("Stop", variant="stop", elem_id="stop-button")
            message_box = gr.HTML(
                info_message(
                    "Launch loads the model with these settings (Plan → Launch this plan here fills them)."
                ),
                elem_id="launch-message",
                min_height=70,  # room for the progress bar while loading
            )
            with gr.Accordion("Engine options", open=False, elem_id="engine-options"):
                inputs.update(engine_inputs(ctx.policy.is_public))
        with gr.Column(scale=3):
            status = gr.HTML(status_html(holder), elem_id="launch-status")
            if not ctx.policy.is_public:  # starting other programs is for the machine's owner only
                with gr.Accordion("External engines (vLLM, SGLang, llama.cpp)", open=False):
                    external.build(ctx.external, plan_state)
    launch_summary.wire(demo, inputs, summary, ctx.model_to_load)

    def on_launch(data: dict, progress: gr.Progress = gr.Progress()) -> str:  # noqa: B008 (Gradio's idiom)
        authorize = functools.partial(authorize_launch, ctx, data[admin])
        form = form_values_of(inputs, data)
        form["model"] = ctx.model_to_load(form["model"])  # the name the box showed for the app's model
        # the status refreshes right after
        return launch_engine(holder, form, progress=progress, authorize=authorize)[0]

    def on_stop(token: str | None) -> tuple[str, str]:
        return stop_engine(holder, authorize=functools.partial(ctx.policy.check_admin, token))

    launch.click(
        on_launch, {*inputs.values(), admin}, message_box, concurrency_limit=None, api_name="launch"
    ).then(lambda: status_html(holder), None, status, show_progress="hidden")
    stop.click(on_stop, admin, [message_box, status], api_name="stop")
    timer = gr.Timer(2.0)  # another tab may launch or stop the shared engine: keep this view current
    timer.tick(lambda: status_html(holder), None, status, show_progress="hidden")
    demo.load(lambda: status_html(holder), None, status)
    return LaunchPanel(inputs, admin, message_box, status, on_launch)
