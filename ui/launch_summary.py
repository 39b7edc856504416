"""The Launch tab's one line above its button: what will run (model and format), where (device, threads)
and in how much memory (weights as the planner reads them, the KV pool the options ask for)."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import gradio as gr

from backend.default_model import load_name
from backend.planner.launch_preview import launch_preview
from ui.common import gib, message

MIB = 1024**2
# the form's inputs the line reads (EngineConfig's names; the form takes kv_cache_memory in MiB)
SUMMARY_FIELDS = ("model", "device", "kv_cache_memory_bytes", "num_kv_blocks")


def positive(value: Any) -> int | None:
    """A number box's value when it is a positive whole number (0 or a bad value: unset, as at launch)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def summary_html(model: str, device: str, kv_mib: Any, num_kv_blocks: Any) -> str:
    if not (model or "").strip():
        return message("info", "Name a model to launch: a Hub id, a local folder or a .gguf file.")
    kv_bytes = positive(kv_mib)
    preview = launch_preview(
        load_name(model.strip()), device or "auto", kv_bytes and kv_bytes * MIB, positive(num_kv_blocks)
    )
    where = f"CPU, {preview.threads} threads" if preview.threads else "GPU"
    weights = (
        f"weights {gib(preview.weights_bytes)}" if preview.weights_bytes else "weights: size known at load"
    )
    body = f"Will run <b>{html.escape(preview.model)}</b> on the {where} · {weights} + {preview.kv_text}"
    return message("info", body_html=body)


def build() -> gr.HTML:
    """The summary line; wire() fills it when the page loads (computing it imports torch, which the app's
    start leaves to a background thread) and keeps it current."""
    return gr.HTML(message("info", "Reading what will run …"), elem_id="launch-summary")


def wire(
    demo: gr.Blocks,
    inputs: dict[str, gr.components.Component],
    summary: gr.HTML,
    to_load: Callable[[str], str],
) -> None:
    """Fill the summary on page load and refresh it when an input it reads changes; to_load maps the model
    box's text to what Launch loads (the app's own model is shown by its Hub id)."""

    def refresh(model: str, device: str, kv_mib: Any, num_kv_blocks: Any) -> str:
        return summary_html(to_load(model or ""), device, kv_mib, num_kv_blocks)

    sources = [inputs[name] for name in SUMMARY_FIELDS]
    demo.load(refresh, sources, summary, show_progress="hidden")
    for component in sources:
        component.change(refresh, sources, summary, show_progress="hidden", queue=False)
