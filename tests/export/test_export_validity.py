"""Every exported file is valid for its tool: bash -n, YAML structure, the Compose schema, JSON, Python."""

from __future__ import annotations

import ast
import importlib.resources
import io
import json
import subprocess
import sys
import zipfile

import jsonschema
import pytest
import yaml
from huggingface_hub import HfApi, SpaceHardware

from backend.export import ExportOptions, export_files, zip_files
from backend.export.skypilot import accelerator
from backend.planner.request import PlanRequest
from tests.common_utils import ROOT
from tests.export_utils import bash_syntax_ok, skypilot_errors, write_files

REMOVED_FLAGS = ("--swap-space", "--speculative-model ", "--num-speculative-tokens", "--use-v2-block-manager")

PLANS = {
    "hub-2xL4": (
        PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct", gpu="L4", num_gpus=2, max_model_len=4096),
        ExportOptions(api_key_env="MY_API_KEY", speculative_method="ngram"),
    ),
    "gguf-1xA10G": (
        PlanRequest(
            model="bartowski/Llama-3.2-1B-Instruct-GGUF", gpu="A10G", quant="Q4_K_M", max_model_len=8192
        ),
        ExportOptions(served_model_name="llama 1b"),
    ),
    "multinode-16xH100": (
        PlanRequest(model="meta-llama/Llama-3.1-405B-Instruct", num_gpus=16, tp=8, pp=2, max_model_len=16384),
        ExportOptions(port=9000),
    ),
    "dp2-2xA100": (
        PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", gpu="A100-80GB", num_gpus=1, dp=2, max_model_len=8192),
        ExportOptions(),
    ),
}


def compose_schema() -> dict:
    """The Compose specification's JSON schema, as shipped by the check-jsonschema package."""
    path = importlib.resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    return json.loads(path.read_text())


def expected_gpus(req: PlanRequest, engine: str) -> int:
    per_replica = req.num_gpus
    return per_replica * req.dp if engine in ("vllm", "sglang", "mii") else per_replica


@pytest.fixture(scope="module", params=list(PLANS))
def export(request, tmp_path_factory):
    req, options = PLANS[request.param]
    files = export_files(req, options, engines="all", formats="all")
    out = write_files(files, tmp_path_factory.mktemp(request.param))
    return req, options, files, out


def test_every_shell_file_passes_bash_n(export):
    _, _, files, out = export
    scripts = [path for path in files if path.endswith(".sh")]
    assert scripts
    for path in scripts:
        check = bash_syntax_ok(out / path)
        assert check.returncode == 0, f"{path}: {check.stderr}"
        assert files[path].startswith("#!/usr/bin/env bash\n")


def test_skypilot_run_and_setup_are_valid_bash(export, tmp_path):
    _, _, files, _ = export
    for path in (p for p in files if p.endswith("skypilot.yaml")):
        task = yaml.safe_load(files[path])
        for key in ("setup", "run"):
            if key in task:
                script = tmp_path / f"{path.replace('/', '_')}.{key}.sh"
                script.write_text(task[key])
                assert bash_syntax_ok(script).returncode == 0, f"{path} {key}"


def test_compose_files_follow_the_compose_spec(export):
    req, options, files, _ = export
    schema = compose_schema()
    composes = {p: f for p, f in files.items() if p.endswith("docker-compose.yml")}
    if req.num_gpus > options.gpus_per_node:
        assert not composes  # one host cannot run it; README says why
        assert (
            "compose runs on one machine" in files["README.md"] or "runs on one machine" in files["README.md"]
        )
        return
    assert composes
    for path, text in composes.items():
        doc = yaml.safe_load(text)
        jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
        engine = path.split("/")[0]
        service = doc["services"][engine]
        device = service["deploy"]["resources"]["reservations"]["devices"][0]
        assert device["count"] == expected_gpus(req, engine) and device["capabilities"] == ["gpu"]
        assert service["ports"][0].startswith(f"{options.host}:{options.port}:")
        assert service["healthcheck"]["test"][0] == "CMD"
        cache = (
            "/data"
            if engine == "tgi"
            else "/root/.ollama"
            if engine == "ollama"
            else "/root/.cache/huggingface"
        )
        assert f"{engine}-cache:{cache}" in service["volumes"]
        assert service.get("ipc") == "host" or service.get("shm_size") == "1g"


def test_k8s_manifests_have_the_expected_structure(export):
    req, options, files, _ = export
    for path in (p for p in files if p.endswith("k8s.yaml")):
        engine = path.split("/")[0]
        docs = [d for d in yaml.safe_load_all(files[path]) if d]
        kinds = {d["kind"]: d for d in docs}
        assert "Service" in kinds
        if req.num_gpus > options.gpus_per_node:
            # pods on different nodes cannot share a ReadWriteOnce claim: each keeps its own cache
            assert "PersistentVolumeClaim" not in kinds
            lws = kinds["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
            assert lws["size"] * options.gpus_per_node == req.num_gpus
            pods = [lws["leaderTemplate"]["spec"], lws["workerTemplate"]["spec"]]
            gpus_per_pod = options.gpus_per_node
            assert "ray start --head" in pods[0]["containers"][0]["command"][2]
        else:
            deployment = kinds["Deployment"]["spec"]
            pods = [deployment["template"]["spec"]]
            gpus_per_pod = expected_gpus(req, engine)
            assert deployment["replicas"] * gpus_per_pod == req.num_gpus * req.dp
            shared = [v for v in pods[0]["volumes"] if "persistentVolumeClaim" in v]
            assert bool(shared) == ("PersistentVolumeClaim" in kinds) == (deployment["replicas"] == 1)
        for pod in pods:
            container = pod["containers"][0]
            assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus_per_pod
            cache = next(v for v in pod["volumes"] if v["name"] == "cache")
            assert "emptyDir" in cache or cache["persistentVolumeClaim"]["claimName"] == f"{engine}-cache"
            shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
            assert shm["emptyDir"]["medium"] == "Memory"
            assert {"mountPath": "/dev/shm", "name": "dshm"} in container["volumeMounts"]
        leader = pods[0]["containers"][0]
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert leader[probe]["httpGet"]["path"] in ("/health", "/api/version")
        service = kinds["Service"]["spec"]
        assert service["type"] == "ClusterIP" and service["ports"][0]["port"] == options.port


def test_skypilot_tasks_request_the_plan_gpus(export):
    req, options, files, _ = export
    for path in (p for p in files if p.endswith("skypilot.yaml")):
        engine = path.split("/")[0]
        task = yaml.safe_load(files[path])
        nodes = task["num_nodes"]
        assert nodes == max(1, req.num_gpus // options.gpus_per_node)
        if engine == "embedded":
            assert "accelerators" not in task["resources"]
            continue
        name, count = task["resources"]["accelerators"].split(":")
        assert name == accelerator(req.gpu)
        assert int(count) * nodes == expected_gpus(req, engine)
        assert set(task["secrets"]) >= {options.hf_token_env}
        assert all(value is None for value in task["secrets"].values())  # names only, never values


def test_skypilot_tasks_pass_skypilots_own_schemas(export):
    _, _, files, _ = export
    tasks = {p: yaml.safe_load(files[p]) for p in files if p.endswith("skypilot.yaml")}
    for path, task in tasks.items():
        assert skypilot_errors(task) == [], path
    if tasks:  # the check can fail: a misspelt field and a bad resources value are both caught
        task = next(iter(tasks.values()))
        assert skypilot_errors({**task, "num_node": 2})
        assert skypilot_errors({**task, "resources": {**task["resources"], "use_spot": "sometimes"}})


def test_endpoint_payload_matches_huggingface_hub(export, monkeypatch):
    """Our JSON equals the body HfApi.create_inference_endpoint would POST (HTTP mocked: no Hub here)."""
    req, _, files, _ = export
    endpoints = {p: f for p, f in files.items() if p.endswith("endpoint.json")}
    if req.num_gpus not in (1, 2, 4, 8):
        assert not endpoints and "Inference Endpoints instances have 1, 2, 4 or 8 GPUs" in files["README.md"]
        return
    assert endpoints
    sent: list[dict] = []

    class Captured(Exception):
        pass

    class Session:
        def post(self, url, headers=None, json=None):
            sent.append(json)
            raise Captured

    monkeypatch.setattr("huggingface_hub.hf_api.get_session", lambda: Session())
    for text in endpoints.values():
        ours = json.loads(text)
        model, compute = ours["model"], ours["compute"]
        assert compute["instanceSize"] == f"x{req.num_gpus}"
        with pytest.raises(Captured):
            HfApi().create_inference_endpoint(
                ours["name"], repository=model["repository"], framework=model["framework"],
                accelerator=compute["accelerator"], instance_size=compute["instanceSize"],
                instance_type=compute["instanceType"], region=ours["provider"]["region"],
                vendor=ours["provider"]["vendor"], min_replica=compute["scaling"]["minReplica"],
                max_replica=compute["scaling"]["maxReplica"], revision=model["revision"], task=model["task"],
                custom_image=model["image"]["custom"], container_args=model["args"], type=ours["type"],
                namespace="someone", token="hf_dummy",
            )  # fmt: skip
        assert sent[-1] == ours


def test_python_files_parse_and_no_removed_flags(export):
    _, _, files, _ = export
    for path, text in files.items():
        if path.endswith(".py"):
            ast.parse(text, filename=path)
        for flag in REMOVED_FLAGS:
            assert flag not in text, f"{path} uses the removed flag {flag}"


def test_maintenance_notes_for_tgi_and_mii(export):
    _, _, files, _ = export
    readme = files["README.md"]
    if any(p.startswith("tgi/") for p in files):
        assert "TGI is in maintenance mode" in readme
    if any(p.startswith("mii/") for p in files):
        assert "dormant since 2025" in readme
    assert "Prefer the vLLM or SGLang export" in readme or not any(
        p.startswith(("tgi/", "mii/")) for p in files
    )


def test_space_bundle():
    req = PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", gpu="L4", num_gpus=1, max_model_len=8192)
    files = export_files(req, ExportOptions(), engines=["vllm"], formats=["space"])
    readme = files["space/README.md"]
    assert readme.startswith("---\n")
    header = yaml.safe_load(readme.split("---\n")[1])
    assert header["sdk"] == "gradio" and header["app_file"] == "app.py"
    assert header["suggested_hardware"] == "l4x1" and header["suggested_hardware"] in {
        h.value for h in SpaceHardware
    }
    assert header["preload_from_hub"] == ["Qwen/Qwen2.5-7B-Instruct"]
    app = files["space/app.py"]
    ast.parse(app)
    assert "MODEL = 'Qwen/Qwen2.5-7B-Instruct'" in app and "gr.ChatInterface" in app
    requirements = files["space/requirements.txt"].split()
    assert any(r.startswith("transformers") for r in requirements)


def test_trtllm_and_ollama_config_files():
    req = PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct", kv_cache_dtype="fp8", max_model_len=4096)
    files = export_files(
        req, ExportOptions(speculative_method="ngram"), engines=["trtllm"], formats=["shell"]
    )
    options = yaml.safe_load(files["trtllm/extra_llm_api_options.yaml"])
    assert options["kv_cache_config"]["dtype"] == "fp8" and options["return_perf_metrics"] is True
    assert options["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": 3,
        "max_matching_ngram_size": 4,
    }
    req = PlanRequest(model="bartowski/Llama-3.2-1B-Instruct-GGUF", quant="Q4_K_M", max_model_len=8192)
    files = export_files(req, ExportOptions(), engines=["ollama"], formats=["shell"])
    lines = files["ollama/Modelfile"].splitlines()
    assert 'FROM "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"' in lines
    assert "PARAMETER num_ctx 8192" in lines


def test_zip_round_trip():
    req = PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct", max_model_len=4096)
    files = export_files(req, ExportOptions(), engines=["vllm", "sglang"], formats=["shell", "k8s"])
    data = zip_files(files)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.namelist() == list(files)
        assert all(archive.read(name).decode() == text for name, text in files.items())
        assert (archive.getinfo("vllm/launch.sh").external_attr >> 16) & 0o777 == 0o755


def test_cli_writes_files_and_prints_the_main_command(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "app.py", "export", "--engine", "vllm", "tgi", "--format", "shell", "compose",
         "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--num-gpus", "2",
         "--max-model-len", "4096",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct" in proc.stdout
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    expected = [f"{engine}/{name}" for engine in ("tgi", "vllm")
                for name in ("client.py", "client.sh", "docker-compose.yml", "launch.sh")]  # fmt: skip
    assert written == ["README.md", *expected]
    assert (out / "vllm/launch.sh").stat().st_mode & 0o111
    readme = (out / "README.md").read_text()
    assert "`vllm/docker-compose.yml`: Docker Compose" in readme and "Targets vLLM 0.33.0" in readme
    bad = subprocess.run(
        [sys.executable, "app.py", "export", "--engine", "tgi", "--model", "org/m-GGUF", "--quant", "Q4_K_M",
         "--out", str(tmp_path / "bad")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "TGI cannot serve 'Q4_K_M'" in bad.stderr and "llama.cpp" in bad.stderr
