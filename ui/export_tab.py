"""Export tab: launch configs for the engines people deploy, from the Plan tab's plan (backend.export)."""

from __future__ import annotations

import contextlib
import html
import tempfile
from pathlib import Path
from typing import Any

import gradio as gr

from backend.export.base import Skipped
from backend.planner.sources import anonymous_hub
from backend.public_policy import PublicPolicy
from ui.common import AppContext, describe, error_message, form_values, message, ok_message, required_int
from ui.inputs import form_number

LANGUAGES = {
    ".sh": "shell",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
    ".py": "python",
    ".md": "markdown",
    ".toml": "yaml",
    ".txt": None,
    "Dockerfile": "dockerfile",
    "Modelfile": "dockerfile",
}


def language_of(path: str) -> str | None:
    name = Path(path).name
    return LANGUAGES.get(name, LANGUAGES.get(Path(path).suffix))


def plan_summary(plan: dict[str, Any] | None) -> str:
    if not plan:
        return error_message("no plan yet: the export uses the Plan tab's model, GPUs and workload")
    return message(
        "info",
        body_html=f"Exporting the plan: <b>{html.escape(plan['model'])}</b> on "
        f"{plan['num_gpus']} × {html.escape(plan['gpu'])}, {html.escape(plan['quant'])}, "
        f"max_model_len {plan['max_model_len'] or 'model limit'}",
    )


def export_plan(form: dict[str, Any], policy: PublicPolicy | None = None) -> tuple:
    """(files state, file picker, preview, zip path, message) for form["plan"] and the export options.
    With a public ``policy`` the plan's model and checkpoint are checked here too (Hub ids, no paths),
    and read from the Hub without the owner's token."""
    from backend.export import ExportOptions, build_export, zip_files
    from backend.planner import PlanRequest

    none = (gr.skip(),) * 4
    plan, engines = form["plan"], form["engines"]
    if not plan:
        return *none, error_message("no plan yet: fill in the Plan tab first")
    if not engines:
        return *none, error_message("choose at least one engine")
    public = policy is not None and policy.is_public
    try:
        if public:
            assert policy is not None
            for name in (plan.get("model"), plan.get("checkpoint")):
                if name:
                    policy.check_model_name(str(name))
        options = ExportOptions(
            host=(form["host"] or "").strip(),
            port=required_int(form["port"], "port"),
            served_model_name=(form["served"] or "").strip() or None,
            api_key_env=(form["api_key"] or "").strip() or None,
            speculative_method=None if form["speculative"] == "off" else form["speculative"],
        )
        with anonymous_hub() if public else contextlib.nullcontext():
            result = build_export(
                PlanRequest(**plan), options, engines=list(engines), formats=list(form["formats"] or [])
            )
    except Exception as exc:  # impossible combinations and bad values come back as ValueError with the reason
        return *none, error_message(describe(exc))
    files = result.files
    folder = Path(tempfile.mkdtemp(prefix="export-"))
    archive = folder / "deploy.zip"
    archive.write_bytes(zip_files(files))
    names = sorted(files)
    # the command people came for, of the first engine ticked (the list is in vLLM-first order)
    launchers = [f"{engine}/launch.sh" for engine in engines if f"{engine}/launch.sh" in files]
    first = launchers[0] if launchers else names[0]
    return (
        files,
        gr.update(choices=names, value=first),
        gr.update(value=files[first], language=language_of(first)),
        str(archive),
        ready_message(len(files), result.skipped),
    )


def ready_message(num_files: int, skipped: list[Skipped]) -> str:
    """How many files are ready and, folded, each chosen engine/format pair that cannot work and why
    (ticking every box makes what can be made instead of refusing it all)."""
    text = f"{num_files} files ready; pick one to preview, or download them all"
    if not skipped:
        return ok_message(text)
    reasons = "".join(
        f"<li><b>{html.escape(s.format if s.engine == '-' else f'{s.engine}/{s.format}')}</b>: "
        f"{html.escape(s.reason)}</li>"
        for s in skipped
    )
    body = (
        f"{html.escape(text)}. <details><summary>{len(skipped)} chosen engine/format pairs cannot work "
        f"and were skipped (README.md lists them too)</summary><ul>{reasons}</ul></details>"
    )
    return message("ok", body_html=body)


def preview(files: dict[str, str] | None, name: str | None) -> Any:
    if not files or name not in files:
        return gr.skip()
    return gr.update(value=files[name], language=language_of(name))


def build(ctx: AppContext, plan_state: gr.State) -> None:
    from backend.export import ENGINES, FORMATS

    files = gr.State({})
    summary = gr.HTML(plan_summary(None), elem_id="export-plan")
    form: dict[str, Any] = {"plan": plan_state}
    with gr.Row():
        with gr.Column(scale=2):
            form["engines"] = gr.CheckboxGroup(
                list(ENGINES), value=["vllm"], label="Engines", elem_id="export-engines"
            )
            form["formats"] = gr.CheckboxGroup(
                list(FORMATS),
                value=[f for f in ("shell", "compose") if f in FORMATS],
                label="Formats",
                elem_id="export-formats",
            )
            with gr.Row():
                form["host"] = gr.Textbox("127.0.0.1", label="Bind address (containers use 0.0.0.0 inside)")
                form["port"] = form_number(8000, label="Port", precision=0, minimum=1, maximum=65535)
            with gr.Row():
                form["served"] = gr.Textbox(
                    "", label="served_model_name (empty = the Hub id, or a local file's or folder's name)"
                )
                form["api_key"] = gr.Textbox("", label="API key env var (e.g. VLLM_API_KEY; empty = no key)")
            form["speculative"] = gr.Dropdown(
                ["off", "ngram", "eagle3", "draft_model"], value="off", label="Speculative decoding"
            )
            generate = gr.Button("Generate files", variant="primary", elem_id="export-generate")
            message_box = gr.HTML(elem_id="export-message")
            download = gr.DownloadButton("Download all (.zip)", elem_id="export-download")
        with gr.Column(scale=3):
            picker = gr.Dropdown([], label="File", elem_id="export-file")
            code = gr.Code(
                label="Preview",
                lines=22,
                max_lines=40,
                buttons=["copy"],
                interactive=False,
                elem_id="export-preview",
            )
    generate.click(
        lambda data: export_plan(form_values(form, data), ctx.policy),
        set(form.values()),
        [files, picker, code, download, message_box],
    )
    picker.change(preview, [files, picker], code)
    plan_state.change(plan_summary, plan_state, summary)
