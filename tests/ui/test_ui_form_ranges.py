"""A number out of range reaches its handler, which names the field, what was wrong and what is allowed.

Gradio's own range check answered "Value 0 is less than minimum value 1." (no field named) and left the
outputs as they were; every number and slider of the app now passes the value on (ui/inputs.py)."""

from __future__ import annotations

import html

import gradio as gr
import pytest

from backend.server.engine_holder import EngineHolder
from tests.ui_utils import PLAN_FORM
from ui import chat_tab, plan_tab
from ui.app import build_demo
from ui.common import AppContext


def numeric_inputs() -> list[gr.Number | gr.Slider]:
    ctx = AppContext(EngineHolder(), "HuggingFaceTB/SmolLM2-135M-Instruct", "http://127.0.0.1:9/v1")
    demo = build_demo(ctx)
    return [b for b in demo.blocks.values() if isinstance(b, gr.Number | gr.Slider)]


def test_every_number_of_the_app_hands_an_out_of_range_value_to_its_handler():
    inputs = numeric_inputs()
    labels = {i.label for i in inputs}
    # the tabs' numbers and sliders are all there (the plan's GPUs, the chat's sliders, the engine knobs)
    assert {"GPUs", "gpu_memory_utilization", "top_p", "max_num_seqs", "Port"} <= labels, labels
    for component in inputs:
        low = (component.minimum if component.minimum is not None else 0) - 1
        # no gr.Error (a plain gr.Number raises one here): the handler decides
        assert component.preprocess(low) == low, component.label
        if component.maximum is not None:
            assert component.preprocess(component.maximum + 1) == component.maximum + 1
    whole = next(i for i in inputs if i.label == "GPUs")
    assert whole.preprocess(2.5) == 2.5 and whole.preprocess(2.0) == 2  # not rounded to another value
    assert isinstance(whole.preprocess(2.0), int) and whole.preprocess(None) is None


def error_text(message: object) -> str:
    assert isinstance(message, str) and "msg-error" in message, message
    return html.unescape(message)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("num_gpus", 0, ["number of GPUs must be a whole number >= 1, got 0"]),
        ("num_gpus", None, ["number of GPUs must be a whole number >= 1, got None"]),
        ("util", 2.0, ["gpu_memory_utilization must be in (0, 1], got 2.0"]),
        ("util", None, ["gpu_memory_utilization must be a number in (0, 1], got None"]),
        ("ttft", -5, ["target TTFT (ms) must be a number >= 0 (0 = no target), got -5"]),
        ("tpot", None, ["target TPOT (ms) must be a number >= 0 (0 = no target), got None"]),
    ],
)
def test_plan_names_the_field_of_a_value_out_of_range(field, value, words):
    *_, message, plan = plan_tab.estimate_plan({**PLAN_FORM, field: value})
    text = error_text(message)
    assert all(w in text for w in words), text
    assert isinstance(plan, type(gr.skip()))  # the last good plan stays; nothing half-updated


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("top_k", 2.5, "top_k must be a whole number >= -1, got 2.5"),
        ("top_k", None, "top_k must be a whole number >= -1, got None"),
        ("temperature", None, "temperature must be a number >= 0, got None"),
        ("temperature", -0.5, "temperature must be >= 0, got -0.5"),
        ("top_p", None, "top_p must be a number in (0, 1], got None"),
    ],
)
def test_chat_names_the_sampling_field_out_of_range(field, value, words):
    form = dict(temperature=0.0, top_p=1.0, top_k=-1, max_tokens=8, seed=-1, stop="", schema="")
    with pytest.raises(ValueError, match="^" + words.replace("(", r"\(").replace(")", r"\)") + "$"):
        chat_tab.sampling_params({**form, field: value})
