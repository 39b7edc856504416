"""Hostile values never execute: the generated shell runs against stub engines (the real ones need GPUs).

Each stub logs the argv it received; the test asserts that no injected command ran and that each hostile
value arrived as exactly one argument.
"""

from __future__ import annotations

import json

import pytest
import yaml

from backend.export import ExportOptions, export_files
from backend.export.base import shell_command, shell_script
from backend.planner.request import PlanRequest
from tests.export_utils import flag_value, logged_env, make_stubs, run_with_stubs, write_files

ENGINE_PROGRAM = {
    "vllm": "vllm", "sglang": "python", "trtllm": "trtllm-serve", "tgi": "text-generation-launcher",
    "mii": "python", "llamacpp": "llama-server", "ollama": "ollama", "embedded": "python",
}  # fmt: skip


def hostile(marker_dir, tag: str) -> str:
    """Shell metacharacters that would each create a marker file if anything evaluated them."""
    m = marker_dir / tag
    return f"x; touch {m}1 && $(touch {m}2) `touch {m}3` 'single' $HOME | touch {m}4 & rm -rf {m}5"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    root = tmp_path_factory.mktemp("safety")
    markers = root / "markers"
    markers.mkdir()
    return root, markers, make_stubs(root / "stubs")


def hostile_export(markers, engine: str):
    model = f"/models/{hostile(markers, 'model')}" + (".gguf" if engine == "llamacpp" else "")
    name = hostile(markers, "name") + ' "double" quotes and spaces'
    req = PlanRequest(model=model, max_model_len=2048)
    options = ExportOptions(served_model_name=name, api_key_env=None if engine == "trtllm" else "SERVER_KEY")
    if engine in ("vllm", "sglang"):
        options.speculative_method = "draft_model"
        options.speculative_model = f"/drafts/{hostile(markers, 'draft')}"
    formats = ["shell"] if engine in ("mii", "embedded") else ["shell", "docker"]  # no official image
    return req, options, export_files(req, options, engines=[engine], formats=formats)


KEY_FROM_ENV = {"vllm": "VLLM_API_KEY", "tgi": "API_KEY", "llamacpp": "LLAMA_API_KEY"}


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm", "tgi", "mii", "llamacpp", "embedded"])
def test_hostile_values_arrive_as_one_argument(sandbox, engine):
    root, markers, stubs = sandbox
    req, options, files = hostile_export(markers, engine)
    out = write_files(files, root / engine)
    env = {"SERVER_KEY": "k3y $(touch {markers}/key)"}
    for script in ("launch.sh", "docker.sh", "client.sh"):
        if f"{engine}/{script}" not in files:
            continue
        proc, calls = run_with_stubs(out / engine / script, stubs, root / "log.jsonl", env)
        assert proc.returncode == 0, proc.stderr
        assert calls, f"{script} ran no program"
        argv = calls[-1]
        if script == "client.sh":
            body = json.loads(flag_value(argv, "-d"))
            assert body["model"] == (
                req.model if engine in ("mii", "trtllm", "tgi") else options.served_model_name
            )
            if options.api_key_env:
                assert "Authorization: Bearer k3y $(touch {markers}/key)" in argv
            continue
        expected_program = "docker" if script == "docker.sh" else ENGINE_PROGRAM[engine]
        assert argv[0] == expected_program
        assert req.model in argv, f"{engine}/{script}: model split or altered: {argv}"
        if engine not in ("mii", "trtllm", "tgi"):  # these answer to the model id only
            assert options.served_model_name in argv
        if engine == "embedded":  # our server reads the key itself from the variable it is told
            assert flag_value(argv, "--api-key-env") == "SERVER_KEY"
        elif engine in KEY_FROM_ENV:  # read from the engine's variable: never on a command line
            assert env["SERVER_KEY"] not in " ".join(argv)
            assert logged_env(root / "log.jsonl")[-1][KEY_FROM_ENV[engine]] == env["SERVER_KEY"]
            if script == "docker.sh":
                assert flag_value(argv, "-e") and KEY_FROM_ENV[engine] in argv
        elif engine != "trtllm":  # the key's value, expanded once by bash and never evaluated
            assert env["SERVER_KEY"] in argv
        if engine == "vllm":
            spec = json.loads(flag_value(argv, "--speculative-config"))
            assert spec["model"] == options.speculative_model
        if engine == "sglang":
            assert flag_value(argv, "--speculative-draft-model-path") == options.speculative_model
    assert list(markers.iterdir()) == [], "an injected command ran"


def test_hostile_values_in_ollama(sandbox):
    root, markers, stubs = sandbox
    model = f"/models/{hostile(markers, 'model')}.gguf"
    options = ExportOptions(served_model_name=hostile(markers, "name"))
    files = export_files(
        PlanRequest(model=model, max_model_len=2048), options, ["ollama"], ["shell", "docker"]
    )
    out = write_files(files, root / "ollama")
    assert f'FROM "{model}"' in files["ollama/Modelfile"].splitlines()
    for script in ("launch.sh", "docker.sh"):
        proc, calls = run_with_stubs(out / "ollama" / script, stubs, root / "log.jsonl")
        assert proc.returncode == 0, proc.stderr
        create = next(call for call in calls if "create" in call)
        name = create[create.index("create") + 1]
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789._-")
    assert list(markers.iterdir()) == []


def test_hostile_values_in_yaml_and_compose_interpolation(sandbox):
    """YAML carries the value verbatim; `$` is escaped for compose (`$$`) and Kubernetes (`$$(`)."""
    _root, markers, _ = sandbox
    req = PlanRequest(model=f"/models/{hostile(markers, 'model')}", max_model_len=2048)
    options = ExportOptions(served_model_name="a $(b) ${c} `d`")
    files = export_files(req, options, engines=["vllm"], formats=["compose", "k8s", "skypilot"])
    compose = yaml.safe_load(files["vllm/docker-compose.yml"])["services"]["vllm"]["command"]
    assert compose[compose.index("--served-model-name") + 1] == "a $$(b) $${c} `d`"
    k8s = next(d for d in yaml.safe_load_all(files["vllm/k8s.yaml"]) if d and d["kind"] == "Deployment")
    args = k8s["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--served-model-name") + 1] == "a $$(b) ${c} `d`"
    assert args[0] == req.model.replace("$(", "$$(")


def test_newlines_are_refused_and_quoting_survives_them(sandbox):
    root, markers, stubs = sandbox
    for field in ("model", "served"):
        bad = "/models/a\ntouch " + str(markers / "nl")
        req = PlanRequest(model=bad if field == "model" else "org/model", max_model_len=2048)
        options = ExportOptions(served_model_name=bad if field == "served" else None)
        with pytest.raises(ValueError, match="newline or control character"):
            export_files(req, options)
    # the quoting layer alone already keeps a newline inside one argument
    value = f"line1\ntouch {markers}/nl2; $(touch {markers}/nl3)"
    script = root / "newline.sh"
    script.write_text(
        shell_script([shell_command(["vllm", "serve", value, "--served-model-name", value])], "t")
    )
    proc, calls = run_with_stubs(script, stubs, root / "log.jsonl")
    assert proc.returncode == 0 and calls == [["vllm", "serve", value, "--served-model-name", value]]
    assert list(markers.iterdir()) == []


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("x; touch /tmp/owned", "neither a local path"),
        ("$(id)", "neither a local path"),
        ("`id`", "neither a local path"),
        ("org/'quoted'", "neither a local path"),
        ("--trust-remote-code", "starts with '-'"),
        ("a/b/c", "neither a local path"),
    ],
)
def test_hub_ids_are_validated_with_huggingface_rules(model, message):
    with pytest.raises(ValueError, match=message):
        export_files(PlanRequest(model=model), ExportOptions())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (ExportOptions(api_key_env="KEY; touch /tmp/owned"), "environment variable name"),
        (ExportOptions(hf_token_env="$(id)"), "environment variable name"),
        (ExportOptions(host="0.0.0.0; id"), "host must be"),
        (ExportOptions(served_model_name="--api-key=x"), "starts with '-'"),
        (ExportOptions(speculative_method="draft_model", speculative_model="x; id"), "neither a local path"),
    ],
)
def test_hostile_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        export_files(PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct"), options)


def test_revision_is_validated():
    with pytest.raises(ValueError, match="revision must be a branch"):
        export_files(
            PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct", revision="main; id"), ExportOptions()
        )


def test_no_secret_values_in_exports(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue123")
    monkeypatch.setenv("MY_KEY", "sk-secretvalue456")
    req = PlanRequest(model="meta-llama/Llama-3.1-8B-Instruct", max_model_len=4096)
    files = export_files(req, ExportOptions(api_key_env="MY_KEY"), engines="all", formats="all")
    for path, text in files.items():
        assert "secretvalue" not in text, path
