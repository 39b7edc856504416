"""The Plan tab suggests the usual name of a quantized checkpoint and hands the one typed to the export."""

from __future__ import annotations

from backend.export import ExportOptions, export_files
from backend.planner.request import PlanRequest
from ui.plan_tab import checkpoint_hint, with_checkpoint


def test_checkpoint_hint_follows_the_quantization():
    assert (
        checkpoint_hint("Qwen/Qwen2.5-7B-Instruct", "awq-int4")["placeholder"]
        == "e.g. Qwen/Qwen2.5-7B-Instruct-AWQ"
    )
    assert (
        checkpoint_hint("Qwen/Qwen2.5-7B-Instruct", "fp8")["placeholder"]
        == "e.g. Qwen/Qwen2.5-7B-Instruct-FP8"
    )
    assert (
        checkpoint_hint("Qwen/Qwen2.5-7B-Instruct", "auto")["placeholder"] == "not needed for these weights"
    )


def test_the_typed_checkpoint_reaches_the_export():
    plan = PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", quant="awq-int4", max_model_len=8192).to_dict()
    plan = with_checkpoint(plan, " Qwen/Qwen2.5-7B-Instruct-AWQ ")
    files = export_files(PlanRequest(**plan), ExportOptions(), ["vllm"], ["shell"])
    assert "vllm serve Qwen/Qwen2.5-7B-Instruct-AWQ " in files["vllm/launch.sh"]
    assert with_checkpoint(plan, "")["checkpoint"] is None and with_checkpoint(None, "x") is None
