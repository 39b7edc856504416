"""Impossible plans get a clear message naming what to change; nothing crashes."""

from __future__ import annotations

import pytest

from backend.export import ExportOptions, export_files
from backend.planner.request import PlanRequest

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"  # bundled preset: 32 attention heads, 8 KV heads
QWEN = "Qwen/Qwen2.5-7B-Instruct"  # bundled preset: 28 attention heads, 4 KV heads


@pytest.mark.parametrize(
    ("engine", "model", "quant", "expected"),
    [
        (
            "tgi",
            "bartowski/Llama-3.2-1B-Instruct-GGUF",
            "Q4_K_M",
            r"TGI cannot serve 'Q4_K_M' \(gguf\).*llama\.cpp",
        ),
        ("llamacpp", LLAMA, "awq", r"llama\.cpp cannot serve 'awq'.*GGUF quantization such as Q4_K_M"),
        ("ollama", LLAMA, "gptq", r"Ollama cannot serve 'gptq'.*GGUF"),
        ("mii", LLAMA, "fp8", r"DeepSpeed-MII cannot serve 'fp8'.*vLLM or SGLang"),
        ("trtllm", "org/model-GGUF", "Q4_K_M", r"TensorRT-LLM cannot serve 'Q4_K_M'.*ModelOpt"),
        ("embedded", LLAMA, "fp8", r"Embedded engine cannot serve 'fp8'.*vLLM"),
        ("llamacpp", LLAMA, "bf16", r"llama\.cpp runs GGUF files only; choose a GGUF quantization"),
        ("vllm", "org/model-GGUF", "Q4_K_M", r"vLLM 0\.33 no longer loads GGUF; write a dense folder"),
    ],
)
def test_engine_quantization_pairs_that_cannot_work(engine, model, quant, expected):
    with pytest.raises(ValueError, match=expected):
        export_files(
            PlanRequest(model=model, quant=quant, max_model_len=4096), ExportOptions(), [engine], ["shell"]
        )


def test_tp_must_divide_the_attention_heads():
    message = (
        r"tensor parallel size 3 does not divide the model's 32 attention heads; use a TP size in \[1, 2, 4"
    )
    with pytest.raises(ValueError, match=message):
        export_files(PlanRequest(model=LLAMA, num_gpus=3), ExportOptions())
    with pytest.raises(ValueError, match=r"tensor parallel size 7 and the model's 4 KV heads"):
        export_files(PlanRequest(model=QWEN, num_gpus=7), ExportOptions())
    files = export_files(PlanRequest(model=LLAMA, num_gpus=4, max_model_len=4096), ExportOptions())
    assert "--tensor-parallel-size 4" in files["vllm/launch.sh"]


def test_unknown_model_skips_the_head_check_with_a_warning():
    req = PlanRequest(model="some-org/not-a-preset-model", num_gpus=3, max_model_len=4096)
    files = export_files(req, ExportOptions(), ["vllm"], ["shell"])
    assert "--tensor-parallel-size 3" in files["vllm/launch.sh"]
    assert "the check that TP divides the heads was skipped" in files["README.md"]


@pytest.mark.parametrize(
    ("req", "engines", "formats", "expected"),
    [
        (
            PlanRequest(model=LLAMA, num_gpus=16, tp=16),
            ["vllm"],
            ["compose"],
            r"runs on one machine.*k8s or skypilot",
        ),
        (PlanRequest(model=LLAMA, num_gpus=16, tp=16), ["vllm"], ["shell"], r"exceeds gpus_per_node=8"),
        (
            PlanRequest(model=LLAMA, num_gpus=4, tp=2, pp=2),
            ["tgi"],
            ["k8s"],
            r"TGI has no pipeline parallelism",
        ),
        (PlanRequest(model=LLAMA, num_gpus=16, tp=16), ["sglang"], ["k8s"], r"use vLLM \(LeaderWorkerSet\)"),
        (
            PlanRequest(model=LLAMA, num_gpus=12, tp=4, pp=3),
            ["vllm"],
            ["k8s"],
            r"must fill whole nodes of 8 GPUs",
        ),
        (
            PlanRequest(model="x/unknown", num_gpus=3),
            ["vllm"],
            ["endpoint"],
            r"1, 2, 4 or 8 GPUs.*k8s format",
        ),
        (
            PlanRequest(model=LLAMA, num_gpus=2, gpu="H100-80GB"),
            ["vllm"],
            ["space"],
            r"Spaces offer no 2x H100-80GB",
        ),
        (
            PlanRequest(model=LLAMA, num_gpus=8, dp=2),
            ["vllm"],
            ["compose"],
            r"16 GPUs \(tp x pp x dp\) exceed",
        ),
        (PlanRequest(model=LLAMA, dp=2), ["tgi"], ["shell"], r"TGI has no data-parallel option.*k8s"),
        (
            PlanRequest(model=LLAMA, num_gpus=2),
            ["embedded"],
            ["shell"],
            r"runs on one device; set tp=pp=dp=1",
        ),
        (PlanRequest(model=LLAMA), ["mii"], ["docker"], r"ships no container image; use the shell"),
        (
            PlanRequest(model=LLAMA, kv_cache_dtype="q4_0"),
            ["vllm"],
            ["shell"],
            r"vLLM has no KV cache dtype 'q4_0'",
        ),
    ],
)
def test_formats_and_engines_that_cannot_express_the_plan(req, engines, formats, expected):
    with pytest.raises(ValueError, match=expected):
        export_files(req, ExportOptions(), engines, formats)


def test_all_skips_what_cannot_work_and_says_why():
    req = PlanRequest(model="bartowski/Llama-3.2-1B-Instruct-GGUF", quant="Q4_K_M", max_model_len=4096)
    files = export_files(req, ExportOptions(), engines="all", formats=["shell"])
    assert {path.split("/")[0] for path in files if "/" in path} == {"llamacpp", "ollama"}
    assert "- sglang / all: SGLang loads GGUF from one local .gguf file" in files["README.md"]
    readme = files["README.md"]
    assert "- tgi / all: TGI cannot serve 'Q4_K_M'" in readme
    assert "- mii / all: DeepSpeed-MII cannot serve" in readme
    req = PlanRequest(model=LLAMA, max_model_len=4096)
    with pytest.raises(ValueError, match="TGI has no Python API export"):
        export_files(req, ExportOptions(), ["vllm", "tgi"], ["shell", "python"])
    files = export_files(req, ExportOptions(), ["vllm", "tgi"], ["shell", "python"], strict=False)
    assert {"vllm/python.py", "tgi/launch.sh"} <= set(files) and "tgi/python.py" not in files
    assert "- tgi / python: TGI has no Python API export" in files["README.md"]


@pytest.mark.parametrize(
    ("req", "options", "kwargs", "expected"),
    [
        (
            PlanRequest(model=LLAMA, num_gpus=4, tp=2),
            ExportOptions(),
            {},
            r"tp x pp = 2 x 1 = 2; set num_gpus to 2",
        ),
        (PlanRequest(model=LLAMA, pp=0), ExportOptions(), {}, r"must each be at least 1"),
        (PlanRequest(model=LLAMA, gpu_memory_utilization=1.5), ExportOptions(), {}, r"\(0, 1\]"),
        (
            PlanRequest(model=LLAMA, quant="int3-magic"),
            ExportOptions(),
            {},
            r"unknown quantization 'int3-magic'",
        ),
        (
            PlanRequest(model=LLAMA, kv_cache_dtype="fp4"),
            ExportOptions(),
            {},
            r"kv_cache_dtype must be one of",
        ),
        (PlanRequest(model=LLAMA), ExportOptions(port=70000), {}, r"port must be in 1-65535"),
        (PlanRequest(model=LLAMA), ExportOptions(dtype="int4"), {}, r"dtype must be one of auto"),
        (PlanRequest(model=LLAMA), ExportOptions(speculative_method="medusa"), {}, r"one of ngram, eagle3"),
        (
            PlanRequest(model=LLAMA),
            ExportOptions(speculative_method="eagle3"),
            {},
            r"needs a speculative model",
        ),
        (
            PlanRequest(model=LLAMA),
            ExportOptions(),
            {"engines": ["vllm2"]},
            r"unknown engine.*choose from vllm",
        ),
        (
            PlanRequest(model=LLAMA),
            ExportOptions(),
            {"formats": ["helm"]},
            r"unknown format.*choose from shell",
        ),
        (PlanRequest(model=""), ExportOptions(), {}, r"model must not be empty"),
    ],
)
def test_bad_values_are_named(req, options, kwargs, expected):
    with pytest.raises(ValueError, match=expected):
        export_files(req, options, **kwargs)
