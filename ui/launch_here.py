"""Plan → Launch as one story: the Plan tab's "Launch this plan here" asks backend.planner.launch_here
whether this machine can run the plan, fills the Launch form with it and starts it, or says why not and
offers the nearest thing that runs (a button) and the Export tab."""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from backend.default_model import hub_reachable, packaged_gguf
from backend.model_names import display_name
from backend.planner import PlanRequest, detect_local_hardware
from backend.planner.launch_here import LaunchDecision, decide
from ui import launch_tab
from ui.common import AppContext, describe, error_message, message
from ui.launch_tab import LaunchPanel
from ui.plan_tab import PlanPanel

GIB = 1024**3


def decide_here(plan: dict[str, Any] | None) -> LaunchDecision:
    """The decision for this machine, as it is now (hardware, Hub, the packaged default model)."""
    if not plan:
        raise ValueError("no plan yet: fill in the Plan tab first")
    gguf = packaged_gguf()
    return decide(
        PlanRequest(**plan), detect_local_hardware(), hub_reachable(timeout=2.0), gguf and str(gguf)
    )


def verdict_html(decision: LaunchDecision) -> str:
    memory = (
        f"planner: {decision.needed_bytes / GIB:.2f} GiB needed, "
        f"{decision.available_bytes / GIB:.2f} GiB free"
        if decision.needed_bytes is not None
        else ""
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in decision.notes)
    if decision.can_launch:
        assert decision.config is not None
        name = html.escape(display_name(decision.config.model))
        text = f"Launching {name} here with the plan's limits ({memory})."
        return message("ok", body_html=f"{text}<ul>{notes}</ul>", elem_id="launch-verdict", data={"can": 1})
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in decision.reasons)
    instead = (
        f"Nearest thing that runs here: {html.escape(decision.alternative_why)} (button below)."
        if decision.alternative is not None
        else "Nothing smaller runs here without the Hub."
    )
    body = (
        f"This plan cannot run here:<ul>{reasons}{notes}</ul>{instead}<br>"
        f"To deploy the plan itself: {html.escape(decision.export_hint)}."
    )
    return message("error", body_html=body, elem_id="launch-verdict", data={"can": 0})


def check_plan(plan: dict[str, Any] | None) -> tuple[str, Any, dict | None, dict | None]:
    """(verdict, alternative button, form to launch now or None, the alternative's form or None)."""
    try:
        decision = decide_here(plan)
    except ValueError as exc:
        return error_message(describe(exc)), gr.update(visible=False), None, None
    take = launch_tab.form_values(decision.config) if decision.config is not None else None
    other = launch_tab.form_values(decision.alternative) if decision.alternative is not None else None
    label = f"Launch {display_name(decision.alternative.model)} instead" if decision.alternative else ""
    button = gr.update(visible=other is not None, value=label)
    return verdict_html(decision), button, take, other


def fill_form(pending: dict | None, names: list[str]) -> tuple:
    """The Launch form's values for a pending launch (and the Launch tab shown), or no change."""
    if pending is None:
        return (*(gr.skip() for _ in names), gr.skip())
    return (*(pending[name] for name in names), gr.Tabs(selected="launch"))


def wire(ctx: AppContext, tabs: gr.Tabs, plan: PlanPanel, launch: LaunchPanel) -> None:
    """Plan's buttons -> the decision -> the Launch form -> the launch, chained."""
    pending, alternative = gr.State(None), gr.State(None)
    names = list(launch.inputs)
    form_outputs = [*launch.inputs.values(), tabs]

    def run_pending(data: dict, progress: gr.Progress = gr.Progress()) -> Any:  # noqa: B008 (Gradio's idiom)
        return gr.skip() if data[pending] is None else launch.on_launch(data, progress)

    def start(trigger: Any, fn: Any, inputs: Any, outputs: list) -> None:
        trigger(fn, inputs, outputs).then(lambda p: fill_form(p, names), pending, form_outputs).then(
            run_pending,
            {pending, launch.admin, *launch.inputs.values()},
            launch.message,
            concurrency_limit=None,
        ).then(lambda: launch_tab.status_html(ctx.holder), None, launch.status)

    start(
        plan.launch_here.click,
        check_plan,
        plan.plan_state,
        [plan.verdict, plan.alternative, pending, alternative],
    )
    start(plan.alternative.click, lambda other: other, alternative, [pending])
