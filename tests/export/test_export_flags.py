"""Every option and enumerated value in every exported command is one the engine's own parser accepts.

The accepted options come from the engines' released sources (tests/data/engine_flags, written by
tools/flagdata.py); a matrix of plans is exported for every engine and format and each command is parsed.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from backend.export import ExportOptions, export_files
from backend.export.files import EXPORTERS
from backend.planner.request import PlanRequest
from tests.common_utils import ROOT
from tests.flag_utils import CHECKED_ENGINES, FLAG_DATA, FlagCheck, flag_data, flagdata, invocations

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
MATRIX = {
    "dense": (PlanRequest(model=LLAMA, max_model_len=8192), ExportOptions()),
    "awq": (
        PlanRequest(
            model=LLAMA, quant="awq", checkpoint="hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
        ),
        ExportOptions(),
    ),
    "gptq": (PlanRequest(model=LLAMA, quant="gptq", checkpoint=f"{LLAMA}-GPTQ-Int4"), ExportOptions()),
    "fp8-online": (PlanRequest(model=LLAMA, quant="fp8", kv_cache_dtype="fp8"), ExportOptions()),
    "fp8-checkpoint": (PlanRequest(model=LLAMA, quant="fp8", checkpoint=f"{LLAMA}-FP8"), ExportOptions()),
    "gguf-hub": (
        PlanRequest(model="bartowski/Llama-3.2-1B-Instruct-GGUF", quant="Q4_K_M", kv_cache_dtype="q8_0"),
        ExportOptions(),
    ),
    "gguf-file": (PlanRequest(model="/models/llama-1b-Q4_K_M.gguf", quant="Q4_K_M"), ExportOptions()),
    "tp4-pp2": (PlanRequest(model=LLAMA, num_gpus=8, tp=4, pp=2, block_size=32), ExportOptions()),
    "dp2": (PlanRequest(model=LLAMA, dp=2, enable_prefix_caching=False), ExportOptions(enforce_eager=True)),
    "multi-node": (
        PlanRequest(model="meta-llama/Llama-3.1-405B-Instruct", num_gpus=16, tp=8, pp=2, max_model_len=16384),
        ExportOptions(),
    ),
    "ngram": (PlanRequest(model=LLAMA), ExportOptions(speculative_method="ngram")),
    "eagle3": (
        PlanRequest(model=LLAMA),
        ExportOptions(speculative_method="eagle3", speculative_model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
    ),
    "draft": (
        PlanRequest(model="/models/llama-8b-Q4_K_M.gguf", quant="Q4_K_M"),
        ExportOptions(speculative_method="draft_model", speculative_model="/models/llama-1b-Q4_K_M.gguf"),
    ),
    "api-key": (
        PlanRequest(model=LLAMA, revision="main"),
        ExportOptions(api_key_env="MY_API_KEY", served_model_name="llama", trust_remote_code=True),
    ),
}


def test_every_checked_engine_has_a_data_file_for_its_target_version():
    for engine in CHECKED_ENGINES:
        data = flag_data(engine)
        assert data["version"] == EXPORTERS[engine].INFO.version
        assert data["source"] and len(data["options"]) > 30
    names = {p.name for p in FLAG_DATA.glob("*.json")}
    assert names == {f"{e}-{EXPORTERS[e].INFO.version}.json" for e in CHECKED_ENGINES}, "stale data files"


def test_removed_and_unknown_options_are_caught():
    check = FlagCheck()
    check.check("x", "llamacpp", ["--draft-max", "4", "-ctk", "q8_0"])
    check.check("x", "vllm", ["--quantization", "bitsandbytes", "--swap-space", "4"])
    check.check("x", "tgi", ["--served-model-name", "m"])
    assert len(check.errors) == 4 and check.checked == 5, check.errors
    assert "rejects --draft-max (removed)" in check.errors[0]


def test_exported_commands_use_only_options_the_engines_accept(capsys):
    check = FlagCheck()
    for label, (req, options) in MATRIX.items():
        files = export_files(req, options, engines=list(CHECKED_ENGINES), formats="all", strict=False)
        for path, text in files.items():
            engine = path.split("/")[0]
            if engine in CHECKED_ENGINES:
                for args in invocations(path, text, engine):
                    check.check(f"{label}:{path}", engine, args)
    assert not check.errors, "\n".join(check.errors)
    kinds = {w.split(":")[1].rsplit("/", 1)[1] for w in check.files}
    assert {
        "launch.sh",
        "docker.sh",
        "docker-compose.yml",
        "k8s.yaml",
        "skypilot.yaml",
        "endpoint.json",
    } <= kinds
    assert {w.split(":")[1].split("/")[0] for w in check.files} == set(CHECKED_ENGINES)
    with capsys.disabled():
        print(
            f"\n{check.checked} flags in {len(check.files)} files, all accepted by the engines' own parsers"
        )


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi"])
def test_quantized_plans_serve_the_quantized_checkpoint_or_say_why(engine):
    req, options = MATRIX["awq"]
    files = export_files(req, options, [engine], ["shell"])
    model_flag = {"vllm": "serve", "sglang": "--model-path", "tgi": "--model-id"}[engine]
    assert f"{model_flag} {req.checkpoint} " in files[f"{engine}/launch.sh"]
    with pytest.raises(ValueError, match=r"set the plan's quantized checkpoint \(e\.g\. '.*-AWQ'\)"):
        export_files(PlanRequest(model=LLAMA, quant="awq"), options, [engine], ["shell"])


def test_fp8_is_quantized_online_where_the_engine_can_and_refused_elsewhere():
    req, options = MATRIX["fp8-online"]
    files = export_files(req, options, ["vllm", "sglang"], ["shell"])
    assert (
        "--quantization fp8" in files["vllm/launch.sh"] and "--quantization fp8" in files["sglang/launch.sh"]
    )
    with pytest.raises(ValueError, match="TensorRT-LLM serves fp8 weights from a checkpoint"):
        export_files(req, options, ["trtllm"], ["shell"])
    with pytest.raises(ValueError, match=r"the Space loads .* unquantized"):
        export_files(req, options, ["vllm"], ["space"])
    files = export_files(*MATRIX["fp8-checkpoint"], ["trtllm"], ["shell"])
    assert f"trtllm-serve {LLAMA}-FP8" in files["trtllm/launch.sh"]


def test_endpoint_payload_names_the_checkpoint(tmp_path):
    files = export_files(*MATRIX["awq"], ["vllm"], ["endpoint"])
    payload = json.loads(files["vllm/endpoint.json"])
    assert payload["model"]["repository"] == MATRIX["awq"][0].checkpoint
    assert payload["model"]["args"][0] == "/repository"


def vllm_exports() -> list[list[str]]:
    """The `vllm serve` arguments of the matrix's launch.sh files (plans vLLM refuses are left out)."""
    argvs = []
    for req, options in MATRIX.values():
        try:
            files = export_files(req, options, engines=["vllm"], formats=["shell"])
        except ValueError:  # a plan vLLM refuses (GGUF): the README says why
            continue
        argvs += invocations("vllm/launch.sh", files["vllm/launch.sh"], "vllm")
    return argvs


@pytest.fixture(scope="module")
def installed_vllm_parser() -> dict:
    """.venv-vllm's real `vllm serve` parser (vLLM's CPU build, `make vllm`): what it accepts, after it
    parsed every vLLM command of the matrix (one process: importing vLLM takes seconds)."""
    python = ROOT / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        pytest.fail("no .venv-vllm: run `make vllm` (make test does it first)")
    proc = subprocess.run(
        [str(python), str(ROOT / "tools" / "flagdata.py"), "vllm-argparse"],
        input=json.dumps(vllm_exports()), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"vLLM's parser rejected an exported command:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_vllm_exports_parse_with_the_installed_vllm(installed_vllm_parser):
    """Reaching here means vLLM 0.32's own argparse parsed every exported vLLM command of the matrix."""
    assert len(vllm_exports()) >= 10
    assert "--speculative-config" in installed_vllm_parser["options"]


@pytest.mark.slow
def test_static_extraction_matches_vllms_real_parser(installed_vllm_parser):
    """The extractor that wrote vllm-0.33.0.json, run on the installed vLLM's source, finds exactly the
    options and values of that vLLM's real argparse parser."""
    real = installed_vllm_parser
    source = next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages/vllm"))
    static = flagdata.vllm(source)
    assert set(static["options"]) == set(real["options"]) - {"-h", "--help"}
    for flag in ("--quantization", "--kv-cache-dtype", "--dtype"):
        assert set(static["choices"][flag]) == set(real["choices"][flag]), flag
