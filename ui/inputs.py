"""Number and slider inputs whose values the handlers check, never Gradio.

Gradio's own range check (`minimum=`, `maximum=`) runs before the handler and answers a value out of range
with a toast that names no field ("Value 0 is less than minimum value 1."), leaving the outputs as they
were. These inputs keep the range in the browser (the spinner arrows and the slider stop there) and pass
any typed value through to the handler, which says which field was wrong and what is allowed
(`ui.common.required_int` and friends, the backend's dataclasses). A fractional value in a whole-number
field is passed as it is, not rounded, so the handler can say "whole number" instead of using another one.

The components are Gradio's own with their `preprocess` replaced on the instance: a subclass would do the
same, but Gradio writes a `.pyi` stub next to the module of every Component subclass when it is imported.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from backend.knobs import FormInput


def unchecked(payload: float | None, precision: int | None) -> float | int | None:
    """A typed value as the handler gets it: whole numbers as int where the field takes whole numbers."""
    if payload is None:
        return None
    if precision == 0 and not float(payload).is_integer():
        return float(payload)  # the handler names the field and asks for a whole number
    return gr.Number.round_to_precision(payload, precision)


def handler_checked(component: gr.Number | gr.Slider) -> gr.Number | gr.Slider:
    """component, passing every value to the handler unchecked (the module docstring says why)."""
    component.preprocess = lambda payload: unchecked(payload, component.precision)  # type: ignore[method-assign]
    return component


def form_number(value: float | None, **kwargs: Any) -> gr.Number:
    """gr.Number(value, **kwargs) with minimum / maximum kept in the browser; the handler checks them."""
    component = handler_checked(gr.Number(value, **kwargs))
    assert isinstance(component, gr.Number)
    return component


def form_slider(minimum: float, maximum: float, **kwargs: Any) -> gr.Slider:
    """gr.Slider(minimum, maximum, **kwargs) whose number box may hold any value; the handler checks it."""
    component = handler_checked(gr.Slider(minimum, maximum, **kwargs))
    assert isinstance(component, gr.Slider)
    return component


def knob_input(spec: FormInput, **kwargs: Any) -> gr.components.Component:
    """The Gradio input a FormInput describes (backend/knobs.py); kwargs add elem_id, scale, info, ..."""
    common = {"label": spec.label, **kwargs}
    if spec.kind == "checkbox":
        return gr.Checkbox(spec.value, **common)
    if spec.kind == "dropdown":
        choices = list(spec.choices or ())
        return gr.Dropdown(choices, value=spec.value, allow_custom_value=spec.is_open, **common)
    if spec.kind == "number":
        return form_number(
            spec.value, precision=spec.precision, minimum=spec.minimum, maximum=spec.maximum, **common
        )
    if spec.kind == "slider":
        assert spec.minimum is not None and spec.maximum is not None  # form_input makes sliders of ranges
        return form_slider(spec.minimum, spec.maximum, value=spec.value, step=spec.step, **common)
    return gr.Textbox(spec.value, **common)
