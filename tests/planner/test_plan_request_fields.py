"""PlanRequest is the one definition of a plan's knobs: every field's metadata makes the `estimate` and
`export` CLI flags and the Plan tab's inputs, with the dataclass's default, range and choices in each."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

import gradio as gr
import pytest

from app import build_parser
from backend.knobs import choices_of, form_input, from_cli_args, knob_fields, scalar_types
from backend.planner.request import PlanRequest
from backend.server.engine_holder import EngineHolder
from tests.ui_utils import PLAN_FORM
from ui import plan_tab
from ui.common import AppContext

INTERNAL = {"flashinfer_sampler"}  # set from vLLM's log by the validation runs, never asked of a user
KINDS = scalar_types(PlanRequest)
CLI = {
    "estimate": ["estimate", "--model", "m"],
    "export": ["export", "--model", "m", "--out", "x"],
}
# the export's --engine names the engines to export (a list, or "all"), not the plan's engine
SKIPPED = {"estimate": set(), "export": {"engine"}}
# a value other than the default for every flag, as typed on the command line
OTHER = dict(
    gpu="L4", num_gpus="4", tp="2", pp="2", dp="3", quant="awq-int4", kv_cache_dtype="fp8",
    max_model_len="4096", input_len="100", output_len="50", concurrency="3", gpu_memory_utilization="0.5",
    engine="sglang", revision="main", checkpoint="org/m-AWQ", max_num_seqs="8", max_num_batched_tokens="512",
    block_size="32", vllm_version="0.11.0", usage_context="llm_class",
)  # fmt: skip


def parse(command: str, *extra: str) -> argparse.Namespace:
    return build_parser().parse_args([*CLI[command], *extra])


def cli_fields(command: str) -> list:
    return [f for f in knob_fields(PlanRequest, "cli") if f.name not in SKIPPED[command] | {"model"}]


def test_every_field_has_metadata_or_is_internal():
    for f in fields(PlanRequest):
        assert f.metadata.get("help"), f"{f.name}: no help text"
        if f.name not in INTERNAL:
            assert f.metadata["cli"] or f.metadata["form"], f"{f.name}: neither a flag nor a form input"
    assert {f.name for f in fields(PlanRequest) if not f.metadata["cli"]} == INTERNAL
    # the Plan form holds the workload and the hardware; the engine's tuning flags are the CLI's
    assert {f.name for f in knob_fields(PlanRequest, "form")} == {
        *("model", "gpu", "num_gpus", "tp", "pp", "quant", "kv_cache_dtype", "checkpoint"),
        *("max_model_len", "input_len", "output_len", "concurrency", "gpu_memory_utilization"),
        *("engine", "vllm_version"),
    }


@pytest.mark.parametrize("command", CLI)
def test_each_cli_takes_every_field_with_the_dataclass_default(command):
    args = parse(command)
    for f in cli_fields(command):
        assert getattr(args, f.name) == f.default, f.name
    assert from_cli_args(PlanRequest, args, engine="vllm") == PlanRequest(model="m")


@pytest.mark.parametrize("command", CLI)
def test_each_cli_flag_reaches_its_field(command):
    extra: list[str] = []
    for f in cli_fields(command):
        flag = "--" + f.name.replace("_", "-")
        if KINDS[f.name] is bool:
            extra.append(flag if not f.default else "--no-" + flag[2:])
        else:
            extra += [flag, OTHER[f.name]]
    args = parse(command, *extra)
    for f in cli_fields(command):
        expected = (not f.default) if KINDS[f.name] is bool else KINDS[f.name](OTHER[f.name])
        assert getattr(args, f.name) == expected, f.name


def test_the_old_spellings_still_work():
    """`--no-enable-prefix-caching` and `--enable-expert-parallel` were the export's only spellings, and
    `--enforce-eager` both CLIs' (the export's now also reaches the plan: no CUDA-graph memory)."""
    args = parse("export", "--no-enable-prefix-caching", "--enable-expert-parallel", "--enforce-eager")
    assert args.enable_prefix_caching is False and args.enable_expert_parallel is True
    assert args.enforce_eager is True
    assert parse("estimate", "--enforce-eager").enforce_eager is True


@pytest.mark.parametrize("command", CLI)
@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--num-gpus", "0", "argument --num-gpus: num_gpus must be an integer >= 1, got 0"),
        ("--max-model-len", "-5", "argument --max-model-len: max_model_len must be an integer >= 1, got -5"),
        ("--input-len", "2.5", "input_len must be an integer >= 1, got '2.5'"),
        ("--gpu-memory-utilization", "1.5", "gpu_memory_utilization must be a number in (0, 1], got 1.5"),
        ("--gpu-memory-utilization", "0", "gpu_memory_utilization must be a number in (0, 1], got 0.0"),
        ("--usage-context", "serve", "invalid choice: 'serve' (choose from 'openai_api_server', 'llm_cl"),
    ],
)
def test_a_value_out_of_range_is_refused_naming_the_range(command, flag, value, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(command, flag, value)
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


def test_form_inputs_have_the_fields_default_range_and_choices():
    """The specs the Plan tab builds its inputs from (backend/knobs.form_input), without gradio."""
    for f in knob_fields(PlanRequest, "form"):
        spec = form_input(PlanRequest, f.name)
        assert spec.label == (f.metadata.get("label") or f.name) and spec.info == f.metadata["help"]
        choices = choices_of(f)
        assert spec.choices == choices, f.name
        if f.default is MISSING:
            continue  # the model: the tab offers its presets
        if choices and f.default is None:
            assert spec.value == choices[0]  # the vLLM version None stands for: the export's target
        elif KINDS[f.name] is int and f.default is None:
            assert (spec.value, spec.minimum) == (0, 0)  # 0 = automatic
        else:
            assert spec.value == (f.default if f.default is not None else ""), f.name
        if KINDS[f.name] in (int, float) and f.default is not None:
            assert (spec.minimum, spec.maximum) == (f.metadata["minimum"], f.metadata.get("maximum"))


def plan_components() -> dict[str, gr.components.Component]:
    ctx = AppContext(EngineHolder(), "HuggingFaceTB/SmolLM2-135M-Instruct", "http://127.0.0.1:9/v1")
    with gr.Blocks() as demo:
        plan_tab.build(ctx, demo)
    return {b.label: b for b in demo.blocks.values() if getattr(b, "label", None)}


def test_the_plan_tab_inputs_are_the_fields_inputs():
    components = plan_components()
    for f in knob_fields(PlanRequest, "form"):
        spec, component = form_input(PlanRequest, f.name), components[form_input(PlanRequest, f.name).label]
        if f.name != "model":  # the model's dropdown lists the presets and starts at one
            assert component.value == spec.value, f.name
        if spec.choices:
            assert [value for _, value in component.choices] == list(spec.choices), f.name
            assert component.allow_custom_value == spec.is_open, f.name
        if spec.kind in ("number", "slider"):
            assert (component.minimum, component.maximum) == (spec.minimum, spec.maximum), f.name
    assert components["GPUs"].elem_id == "plan-num-gpus" and components["GPU"].elem_id == "plan-gpu"
    slider = components["gpu_memory_utilization"]
    assert isinstance(slider, gr.Slider) and (slider.minimum, slider.maximum, slider.value) == (0, 1, 0.92)


def test_the_form_as_it_first_shows_is_the_dataclass_default():
    """The Plan form's first values make PlanRequest's defaults; the version box shows the export's target,
    which is what vllm_version=None stands for."""
    form = {"model": PLAN_FORM["model"], "ttft": 0, "tpot": 0}
    for name in plan_tab.PLAN_FIELDS[1:]:
        form[plan_tab.FORM_KEYS.get(name, name)] = form_input(PlanRequest, name).value
    target = choices_of(next(f for f in fields(PlanRequest) if f.name == "vllm_version"))[0]
    assert plan_tab.plan_request(form) == PlanRequest(model=PLAN_FORM["model"], vllm_version=target)


RANGED = [
    f
    for f in fields(PlanRequest)
    if KINDS[f.name] in (int, float) and f.metadata.get("minimum") is not None
    and f.name not in ("tp", "max_model_len")  # checked against the model's heads and limit as well
]  # fmt: skip


@pytest.mark.parametrize("f", RANGED, ids=lambda f: f.name)
def test_the_planner_checks_each_number_against_its_knobs_range(f):
    """estimate() (the Python API, no CLI in between) refuses the value just below the range."""
    from backend.planner import estimate

    low = f.metadata["minimum"] - (0 if f.metadata.get("is_minimum_exclusive") else 1)
    with pytest.raises(ValueError, match=rf"^{f.name} must be .*{f.metadata['minimum']:g}.*, got {low!r}$"):
        estimate(PlanRequest(model=PLAN_FORM["model"], **{f.name: KINDS[f.name](low)}))
