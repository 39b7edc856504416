"""Plan → Launch: backend.planner.launch_here.decide on this machine's real hardware (no GPU here), with the
Hub reachable or not given as an argument (the Hub itself is never contacted), and the UI's check_plan
that turns a decision into the Launch form's values. A GPU host is a stand-in LocalHardware (named so)."""

from __future__ import annotations

import html
from dataclasses import replace

import pytest

from backend.default_model import DEFAULT_HUB_ID, packaged_gguf
from backend.engine.config import EngineConfig
from backend.model_names import display_name, gguf_type
from backend.planner import PlanRequest, detect_local_hardware
from backend.planner.hardware import LocalGPU
from backend.planner.launch_here import GIB, HEADROOM, decide
from backend.public_policy import PublicPolicy
from backend.server.engine_holder import EngineHolder
from ui import launch_here, launch_tab, plan_tab
from ui.common import AppContext

GGUF = str(packaged_gguf())


@pytest.fixture(scope="module")
def machine():
    return detect_local_hardware()


def test_a_small_local_plan_is_taken_over_with_its_limits(machine):
    plan = PlanRequest(
        model=GGUF,
        gpu="CPU",
        engine="embedded",
        max_model_len=2048,
        max_num_seqs=8,
        block_size=32,
        kv_cache_dtype="fp8",
    )
    decision = decide(plan, machine, hub_online=False, default_gguf=GGUF)
    assert decision.can_launch and decision.reasons == [] and decision.notes == []
    config = decision.config
    assert config.model == GGUF and config.max_model_len == 2048 and config.max_num_seqs == 8
    assert config.block_size == 32 and config.enable_prefix_caching and config.kv_cache_dtype == "fp8"
    assert 0 < decision.needed_bytes < decision.available_bytes * HEADROOM


def test_the_default_models_hub_id_runs_from_its_packaged_gguf_offline(machine):
    decision = decide(PlanRequest(model=DEFAULT_HUB_ID, quant="bf16"), machine, False, GGUF)
    assert decision.can_launch and decision.config.model == GGUF
    assert decision.config.dtype == "bfloat16"
    if not machine.gpus:  # this machine: the plan's H100 is named as what differs
        assert "no GPU here" in decision.notes[0] and "H100-80GB" in decision.notes[0]


def test_an_8b_plan_offline_says_no_hub_and_offers_the_default_model(machine):
    plan = PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct", quant="bf16")
    decision = decide(plan, machine, hub_online=False, default_gguf=GGUF)
    assert not decision.can_launch and decision.config is None
    assert any("no Hub access" in r and "Llama-3.1-8B-Instruct" in r for r in decision.reasons)
    assert decision.alternative.model == GGUF and "default model" in decision.alternative_why
    assert "Export tab" in decision.export_hint and "H100-80GB" in decision.export_hint


def test_a_70b_plan_needs_more_memory_than_this_machine_by_the_planners_own_estimate(machine):
    plan = PlanRequest(model="meta-llama/Llama-3.1-70B-Instruct", quant="bf16")
    decision = decide(plan, machine, hub_online=True, default_gguf=GGUF)
    (reason,) = decision.reasons
    assert reason.startswith("not enough memory") and f"{decision.needed_bytes / GIB:.2f} GiB" in reason
    assert decision.needed_bytes > 130 * GIB  # 70B parameters in bf16
    alternative = decision.alternative  # with the Hub: the largest preset of the family that fits here
    assert alternative.model.startswith("meta-llama/") and alternative.model != plan.model
    assert "largest preset" in decision.alternative_why


def test_a_quantization_without_its_checkpoint_is_named(machine):
    plan = PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", quant="awq-int4")
    reasons = decide(plan, machine, hub_online=True, default_gguf=GGUF).reasons  # + memory, when RAM is short
    assert any("awq-int4 weights need a checkpoint" in r and "Quantized checkpoint" in r for r in reasons)


def test_on_a_gpu_host_the_gpus_free_memory_decides_stand_in_hardware(machine):
    gpu = LocalGPU(0, "NVIDIA L4", 24 * GIB, 1 * GIB, "L4")  # a busy L4 with 1 GiB free
    host = replace(machine, gpus=[gpu])
    decision = decide(PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", quant="bf16"), host, True, GGUF)
    assert any("NVIDIA L4 GPU has 1.00 GiB free" in r for r in decision.reasons)
    assert "runs on one NVIDIA L4" in decision.notes[0]


def test_check_plan_fills_the_launch_form_or_explains(machine):
    plan = PlanRequest(model=GGUF, gpu="CPU", engine="embedded", max_model_len=2048).to_dict()
    verdict, button, form, other = launch_here.check_plan(plan)
    assert "data-can='1'" in verdict and form is not None and other is None and not button["visible"]
    assert form["model"] == DEFAULT_HUB_ID  # the form names the bundled file by its Hub id, not its path
    assert launch_tab.launch_config(form) == launch_here.decide_here(plan).config  # the form round-trips
    assert form["kv_cache_memory_bytes"] >= 256  # MiB in the form
    verdict, button, form, other = launch_here.check_plan(None)
    assert "no plan yet" in html.unescape(verdict) and form is None


def test_the_launch_card_names_the_model_and_its_format():
    assert display_name(GGUF) == "SmolLM2-135M-Instruct · GGUF Q4_1"
    quantization = "gguf Q8_0 (1 tensor), Q4_1 (210 tensors)"
    assert gguf_type(quantization) == "Q4_1"
    assert (
        display_name("/m/Llama-3.1-8B-Instruct-Q4_K_M.gguf", quantization)
        == "Llama-3.1-8B-Instruct · GGUF Q4_1"
    )
    assert display_name("/models/qwen2.5-7b/", dtype="bfloat16") == "qwen2.5-7b · bfloat16"
    assert display_name("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
    assert display_name(EngineConfig(model=GGUF).model).startswith("SmolLM2-135M-Instruct")


def test_the_launch_box_names_the_apps_model_without_a_path(tmp_path):
    local = AppContext(EngineHolder(), GGUF, "http://127.0.0.1:7860/v1")
    assert local.shown_model == DEFAULT_HUB_ID and local.model_to_load(f"{DEFAULT_HUB_ID} ") == GGUF
    assert DEFAULT_HUB_ID in launch_tab.model_help() and "GGUF Q4_1" in launch_tab.model_help()
    assert plan_tab.model_choices(local, ["Qwen/Qwen3-8B", DEFAULT_HUB_ID]) == [
        "Qwen/Qwen3-8B",
        DEFAULT_HUB_ID,
    ]
    typed = {**launch_tab.form_defaults(), "model": f" {DEFAULT_HUB_ID}"}
    assert launch_tab.launch_config(typed).model == GGUF  # typing the Hub id loads the bundled file too
    folder = tmp_path / "owners-llama"
    folder.mkdir()
    policy = PublicPolicy(is_public=True, admin_token="admin")
    public = AppContext(EngineHolder(), str(folder), "http://127.0.0.1:7860/v1", policy=policy)
    assert public.shown_model == "owners-llama" and public.model_to_load("owners-llama") == str(folder)
    assert plan_tab.model_choices(public, ["Qwen/Qwen3-8B"]) == ["Qwen/Qwen3-8B"]  # no path offered
    launch_tab.authorize_launch(public, "admin", EngineConfig(model=GGUF))  # bundled: no Hub size check
