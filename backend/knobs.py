"""Knobs: dataclass fields with the metadata every front end reads, so that CLI flags and form inputs
derive from one dataclass (vLLM's `EngineArgs.add_cli_args`, nano-vllm's `Config` filter).

A knob's metadata: ``help``; ``label`` (the form's, default the field name) and ``noun`` (how the form's
messages name the field, default the label); ``choices`` (a tuple, or a function that reads a catalog when
asked); ``is_open`` (the choices are suggestions: other spellings pass on to the dataclass's own check, like
a GPU name in lower case or a KV dtype alias); ``minimum`` / ``maximum`` (inclusive, unless
``is_minimum_exclusive``: vLLM's (0, 1] for gpu_memory_utilization); ``step`` (a slider's); ``cli`` and
``form`` (whether a flag or a form input is made). Defaults come from the dataclass alone: a form input
for an optional number shows 0 (automatic), and a dropdown for an optional name shows its first choice,
which is what None resolves to. EngineConfig (engine/config.py) and PlanRequest (planner/request.py) use it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from functools import cache
from typing import Any, Literal, get_args, get_origin, get_type_hints

from backend.errors import UserError

Choices = tuple[str, ...] | Callable[[], Sequence[str]] | None
InputKind = Literal["checkbox", "dropdown", "textbox", "number", "slider"]


def knob(
    default: Any = MISSING,
    help: str = "",
    choices: Choices = None,
    minimum: float | None = None,
    **more: Any,
) -> Any:
    """A dataclass field with the metadata every front end reads (`more`: the module docstring's keys)."""
    metadata = {"help": help, "choices": choices, "minimum": minimum, "cli": True, "form": False, **more}
    return field(metadata=metadata) if default is MISSING else field(default=default, metadata=metadata)


@cache
def scalar_types(cls: type) -> dict[str, type]:
    """The scalar type of each field of a dataclass (`int | None` -> int, `Literal["a", "b"]` -> str)."""
    types = {}
    for name, hint in get_type_hints(cls).items():
        if get_origin(hint) is Literal:
            hint = type(get_args(hint)[0])
        types[name] = next(t for t in getattr(hint, "__args__", (hint,)) if t is not type(None))
    return types


def knob_fields(cls: type, key: Literal["cli", "form"]) -> list[Field]:
    """The fields that get a CLI flag (key="cli") or a form input (key="form")."""
    return [f for f in fields(cls) if f.metadata.get(key)]


def choices_of(f: Field) -> tuple[str, ...] | None:
    choices = f.metadata.get("choices")
    return tuple(choices()) if callable(choices) else choices


def default_of(f: Field) -> Any:
    return None if f.default is MISSING else f.default


def range_text(f: Field) -> str:
    """A number field's range in words: "in (0, 1]", ">= 1" ("" without one)."""
    low, high = f.metadata.get("minimum"), f.metadata.get("maximum")
    is_exclusive = f.metadata.get("is_minimum_exclusive")
    if low is not None and high is not None:
        return f"in {'(' if is_exclusive else '['}{low:g}, {high:g}]"
    if low is not None:
        return f"{'>' if is_exclusive else '>='} {low:g}"
    return "" if high is None else f"<= {high:g}"


def allowed_text(f: Field, kind: type) -> str:
    """What a value of a number field may be: "an integer >= 1", "a number in (0, 1]"."""
    return " ".join(filter(None, ["an integer" if kind is int else "a number", range_text(f)]))


def is_in_range(f: Field, value: float) -> bool:
    low, high = f.metadata.get("minimum"), f.metadata.get("maximum")
    if low is not None and (value <= low if f.metadata.get("is_minimum_exclusive") else value < low):
        return False
    return high is None or value <= high


def check_number(f: Field, value: Any, kind: type) -> None:
    """UserError naming the field and its range unless value is in it (or None where the default is)."""
    if value is None and f.default is None:
        return
    is_kind = isinstance(value, int if kind is int else int | float) and not isinstance(value, bool)
    if not is_kind or not is_in_range(f, value):
        allowed = allowed_text(f, kind) if kind is int else range_text(f)
        unset = " or None (automatic)" if f.default is None else ""
        raise UserError(f"{f.name} must be {allowed}{unset}, got {value!r}")


def cli_type(f: Field, kind: type) -> Callable[[str], Any]:
    """argparse's `type=` for a number field: parses and checks the range, naming field and range."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{f.name} must be {allowed_text(f, kind)}, got {text!r}"
            ) from None
        if not is_in_range(f, value):
            raise argparse.ArgumentTypeError(f"{f.name} must be {allowed_text(f, kind)}, got {value}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


def cli_help(f: Field, kind: type) -> str:
    parts = [f.metadata["help"]]
    choices = choices_of(f)
    if choices and f.metadata.get("is_open"):
        parts.append(f"one of: {', '.join(choices)}")
    if kind in (int, float) and range_text(f):
        parts.append(allowed_text(f, kind))
    if default_of(f) is not None:
        parts.append(f"default: {default_of(f)}")
    return "; ".join(p for p in parts if p).replace("%", "%%")  # argparse formats help with %


def add_cli_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    skip: Collection[str] = (),
    is_required: bool = True,
) -> None:
    """One `--field-name` per CLI knob of cls (`--no-field-name` too for booleans), help, default,
    choices and range from the field; a field without a default is required unless is_required=False."""
    kinds = scalar_types(cls)
    for f in knob_fields(cls, "cli"):
        if f.name in skip:
            continue
        flag, kind, help_text = "--" + f.name.replace("_", "-"), kinds[f.name], cli_help(f, kinds[f.name])
        if kind is bool:
            action = argparse.BooleanOptionalAction
            parser.add_argument(flag, action=action, default=default_of(f), help=help_text)
            continue
        choices = None if f.metadata.get("is_open") else choices_of(f)
        parser.add_argument(
            flag,
            type=cli_type(f, kind) if kind in (int, float) else kind,
            default=default_of(f),
            choices=choices,
            required=is_required and f.default is MISSING,
            help=help_text,
        )


def from_cli_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """cls from the parsed flags of its CLI knobs (those add_cli_args made), overrides on top."""
    values = {f.name: getattr(args, f.name) for f in knob_fields(cls, "cli") if hasattr(args, f.name)}
    return cls(**{**values, **overrides})


@dataclass(slots=True)
class FormInput:
    """What a form input for one field shows, without gradio (ui/inputs.py `knob_input` builds it)."""

    name: str
    kind: InputKind
    label: str
    info: str
    value: Any
    choices: tuple[str, ...] | None = None
    is_open: bool = False  # a dropdown that takes a typed value too
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    precision: int | None = None  # 0: whole numbers


def form_input(cls: type, name: str) -> FormInput:
    """The form input of one field: its label, default, choices and range, all from the field."""
    f = next(f for f in fields(cls) if f.name == name)
    kind, default, meta = scalar_types(cls)[name], default_of(f), f.metadata
    spec = FormInput(name, "textbox", meta.get("label") or name, meta["help"], default)
    choices = choices_of(f)
    if kind is bool:
        spec.kind = "checkbox"
    elif choices:
        spec.kind, spec.choices, spec.is_open = "dropdown", choices, bool(meta.get("is_open"))
        spec.value = choices[0] if default is None else default
    elif kind is int:
        spec.kind, spec.precision, spec.minimum = "number", 0, meta.get("minimum")
        if default is None:  # 0 = automatic (Gradio sends 0 for an empty number)
            spec.value, spec.minimum = 0, 0
        spec.maximum = meta.get("maximum")
    elif kind is float:
        spec.minimum, spec.maximum, spec.step = meta.get("minimum"), meta.get("maximum"), meta.get("step")
        has_range = spec.minimum is not None and spec.maximum is not None
        spec.kind = "slider" if has_range else "number"
    elif default is None:
        spec.value = ""
    return spec
