"""What each format needs to really deploy: caches where the image keeps them, post-start steps, the
files a task reads, and settings that must not be overridden (issue 11's list, one test per item)."""

from __future__ import annotations

import ast

import pytest
import yaml

from backend.export import ExportOptions, export_files
from backend.export.files import EXPORTERS
from backend.planner.request import PlanRequest

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
GGUF = "/models/llama-1b-Q4_K_M.gguf"
MULTI_NODE = PlanRequest(
    model="meta-llama/Llama-3.1-405B-Instruct", num_gpus=16, tp=8, pp=2, max_model_len=16384
)


def test_trtllm_yaml_keeps_the_planned_kv_fraction():
    files = export_files(PlanRequest(model=LLAMA, max_model_len=8192), ExportOptions(), ["trtllm"], ["shell"])
    config = yaml.safe_load(files["trtllm/extra_llm_api_options.yaml"])
    flag = files["trtllm/launch.sh"].split("--kv_cache_free_gpu_memory_fraction ")[1].split()[0]
    assert config["kv_cache_config"]["free_gpu_memory_fraction"] == float(flag)


def test_tgi_caches_weights_in_data_and_answers_to_the_model_id():
    files = export_files(
        PlanRequest(model=LLAMA, max_model_len=8192), ExportOptions(served_model_name="x"), ["tgi"], "all"
    )
    assert "--served-model-name" not in "".join(files.values())
    assert "-v tgi-cache:/data" in files["tgi/docker.sh"]
    assert "tgi-cache:/data" in yaml.safe_load(files["tgi/docker-compose.yml"])["services"]["tgi"]["volumes"]
    assert f"model='{LLAMA}'" in files["tgi/client.py"]
    assert "--max-concurrent-requests" not in files["tgi/launch.sh"]
    assert "maintenance mode since December 2025" in files["README.md"] and "3.3.7" in files["tgi/launch.sh"]


def test_ollama_creates_its_model_and_keeps_it_in_every_format():
    req = PlanRequest(model=GGUF, quant="Q4_K_M", max_model_len=4096)
    files = export_files(req, ExportOptions(served_model_name="Llama 1B"), ["ollama"], "all", strict=False)
    k8s = {d["kind"]: d for d in yaml.safe_load_all(files["ollama/k8s.yaml"]) if d}
    pod = k8s["Deployment"]["spec"]["template"]["spec"]
    hook = pod["containers"][0]["lifecycle"]["postStart"]["exec"]["command"][2]
    assert "until ollama list" in hook and "ollama create llama-1b -f Modelfile" in hook
    assert {"name": "cache", "mountPath": "/root/.ollama"} in pod["containers"][0]["volumeMounts"]
    assert k8s["PersistentVolumeClaim"]["metadata"]["name"] == "ollama-cache"
    compose = yaml.safe_load(files["ollama/docker-compose.yml"])["services"]
    assert "ollama-cache:/root/.ollama" in compose["ollama"]["volumes"]
    assert compose["ollama-post-start-1"]["command"] == ["create", "llama-1b", "-f", "Modelfile"]
    assert "-v ollama-cache:/root/.ollama" in files["ollama/docker.sh"]
    assert "docker exec ollama-server ollama create llama-1b" in files["ollama/docker.sh"]
    assert "ollama create llama-1b -f Modelfile" in files["ollama/launch.sh"].replace(" \\\n  ", " ")
    assert EXPORTERS["ollama"].INFO.version == "0.24.0"


def test_skypilot_installs_ray_for_multi_node_and_uploads_trtllm_options():
    task = yaml.safe_load(
        export_files(MULTI_NODE, ExportOptions(), ["vllm"], ["skypilot"])["vllm/skypilot.yaml"]
    )
    assert 'pip install "ray[default]==' in task["setup"] and "ray start --head" in task["run"]
    files = export_files(
        PlanRequest(model=LLAMA, max_model_len=8192), ExportOptions(), ["trtllm"], ["skypilot"]
    )
    task = yaml.safe_load(files["trtllm/skypilot.yaml"])
    assert task["workdir"] == "." and "--config extra_llm_api_options.yaml" in task["run"]
    assert "libopenmpi-dev" in task["setup"] and "trtllm/extra_llm_api_options.yaml" in files


def test_skypilot_header_names_the_secrets_the_task_reads():
    options = ExportOptions(hf_token_env="MY_HF", api_key_env="MY_KEY")
    text = export_files(PlanRequest(model=LLAMA, max_model_len=8192), options, ["vllm"], ["skypilot"])[
        "vllm/skypilot.yaml"
    ]
    assert "--secret MY_HF --secret MY_KEY" in text.splitlines()[0]
    assert set(yaml.safe_load(text)["secrets"]) == {"MY_HF", "MY_KEY"}


def test_trtllm_containers_get_nvidias_ulimits():
    files = export_files(
        PlanRequest(model=LLAMA, max_model_len=8192), ExportOptions(), ["trtllm"], ["docker", "compose"]
    )
    assert (
        "--ulimit memlock=-1" in files["trtllm/docker.sh"]
        and "--ulimit stack=67108864" in files["trtllm/docker.sh"]
    )
    service = yaml.safe_load(files["trtllm/docker-compose.yml"])["services"]["trtllm"]
    assert service["ulimits"] == {"memlock": -1, "stack": 67108864}


def test_llamacpp_pins_its_image_and_sizes_slots_to_the_kv_cache():
    assert EXPORTERS["llamacpp"].INFO.image.endswith(":server-cuda-b10398")
    gguf = {"quant": "gguf-q4_k_m", "checkpoint": "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"}
    req = PlanRequest(model=LLAMA, gpu="L4", max_model_len=131072, concurrency=16, **gguf)
    text = export_files(req, ExportOptions(), ["llamacpp"], ["shell"])["llamacpp/launch.sh"]
    # 16 x 131,072 tokens (256 GiB of KV) do not fit an L4; one sequence of 131,072 does
    assert (
        "-c 131072 " in text
        and "-np 1 " in text
        and "-hf bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q4_K_M" in text
    )
    with pytest.raises(ValueError, match="needs more KV cache than fits"):
        export_files(
            PlanRequest(model=LLAMA, gpu="T4", max_model_len=131072, **gguf),
            ExportOptions(),
            ["llamacpp"],
            ["shell"],
        )


def test_vllm_python_snippet_has_no_server_only_arguments_and_block_size_is_vllms_choice():
    files = export_files(
        PlanRequest(model=LLAMA, dp=2, max_model_len=8192), ExportOptions(), ["vllm"], ["shell", "python"]
    )
    tree = ast.parse(files["vllm/python.py"])
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "LLM")
    assert "data_parallel_size" not in {k.arg for k in call.keywords}
    assert (
        "--data-parallel-size 2" in files["vllm/launch.sh"] and "--block-size" not in files["vllm/launch.sh"]
    )
    files = export_files(
        PlanRequest(model=LLAMA, block_size=64, max_model_len=8192), ExportOptions(), ["vllm"], ["shell"]
    )
    assert "--block-size 64" in files["vllm/launch.sh"]


def test_sglang_uses_marlin_kernels_and_full_flag_names():
    req = PlanRequest(model=LLAMA, quant="gptq", checkpoint=f"{LLAMA}-GPTQ-Int4", num_gpus=2, dp=2)
    text = export_files(req, ExportOptions(), ["sglang"], ["shell"])["sglang/launch.sh"]
    assert "--quantization gptq_marlin" in text and "--tp-size 2" in text and "--dp-size 2" in text


def test_plan_suggests_the_usual_checkpoint_names():
    from backend.export.plan import suggest_checkpoint

    assert suggest_checkpoint("Qwen/Qwen2.5-7B-Instruct", "awq") == "Qwen/Qwen2.5-7B-Instruct-AWQ"
    assert suggest_checkpoint("Qwen/Qwen2.5-7B-Instruct", "gptq-int4") == "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4"
    assert suggest_checkpoint("Qwen/Qwen2.5-7B-Instruct", "fp8") == "Qwen/Qwen2.5-7B-Instruct-FP8"
    assert suggest_checkpoint("Qwen/Qwen2.5-7B-Instruct", "bf16") is None


def test_one_engine_table_for_planner_export_and_ui():
    from backend.engines import ENGINE_TRAITS, ENGINES
    from backend.export import ENGINES as EXPORT_ENGINES
    from backend.planner.request import ENGINES as PLANNER_ENGINES

    assert ENGINES == EXPORT_ENGINES == PLANNER_ENGINES and set(EXPORTERS) == set(ENGINE_TRAITS)
    assert all(EXPORTERS[name].INFO.title == ENGINE_TRAITS[name].title for name in ENGINES)
