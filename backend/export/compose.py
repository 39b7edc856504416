"""docker-compose.yml (Compose specification): one service on one host, with a GPU reservation."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from backend.export.base import compose_token, dump_yaml
from backend.export.engine import Unsupported
from backend.export.plan import ExportPlan
from backend.export.scripts import HF_CACHE, client_model, env_names, single_node


def healthcheck(mod: ModuleType) -> dict:
    info = mod.INFO
    if info.name == "ollama":
        test = ["CMD", "ollama", "list"]
    elif info.name == "llamacpp":
        test = ["CMD", "curl", "-fsS", f"http://localhost:{info.container_port}{info.health_path}"]
    else:
        url = f"http://localhost:{info.container_port}{info.health_path}"
        test = ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen({url!r})"]
    return {"test": test, "interval": "30s", "timeout": "10s", "retries": 5, "start_period": "30m"}


def service(plan: ExportPlan, mod: ModuleType) -> dict:
    info = mod.INFO
    argv = mod.command(plan, "0.0.0.0", info.container_port)
    argv = argv[len(info.entrypoint) :] if info.entrypoint else argv
    gpus = plan.gpus_per_replica * (plan.dp if info.native_dp else 1)
    env = {"HF_TOKEN": f"${{{plan.options.hf_token_env}:-}}"}
    env |= {name: f"${{{name}:?set {name} first}}" for name in env_names(argv)}
    if hasattr(mod, "environment"):
        extra = mod.environment(plan, "0.0.0.0", info.container_port)
        env |= {name: compose_token(value) for name, value in extra.items()}
    svc: dict = {"image": info.image, "command": [compose_token(token) for token in argv]}
    svc["ports"] = [f"{plan.options.host}:{plan.options.port}:{info.container_port}"]
    svc["environment"] = env
    volumes = [f"hf-cache:{HF_CACHE}"]
    if plan.local:
        folder = str(Path(plan.model).parent) if plan.model.endswith(".gguf") else plan.model
        volumes.append({"type": "bind", "source": folder, "target": folder, "read_only": True})
    if hasattr(mod, "extra_files"):
        svc["working_dir"] = "/config"
        volumes += [
            {"type": "bind", "source": f"./{name}", "target": f"/config/{name}", "read_only": True}
            for name in mod.extra_files(plan)
        ]
    svc["volumes"] = volumes
    if "--ipc=host" in info.container_opts:
        svc["ipc"] = "host"
    else:
        svc["shm_size"] = "1g"
    devices = [{"driver": "nvidia", "count": gpus, "capabilities": ["gpu"]}]
    svc["deploy"] = {"resources": {"reservations": {"devices": devices}}}
    svc["healthcheck"] = healthcheck(mod)
    svc["restart"] = "unless-stopped"
    return svc


def compose_yml(plan: ExportPlan, mod: ModuleType) -> str:
    info = mod.INFO
    if info.image is None:
        raise Unsupported(
            f"{info.title} ships no container image, so there is no compose file; use the shell format"
        )
    single_node(plan, "docker compose")
    gpus = plan.gpus_per_replica * (plan.dp if info.native_dp else 1)
    if gpus > plan.options.gpus_per_node:
        raise Unsupported(
            f"compose runs on one host: {gpus} GPUs (tp x pp x dp) exceed "
            f"gpus_per_node={plan.options.gpus_per_node}; "
            "use the k8s format, lower dp, or raise gpus_per_node"
        )
    services = {info.name: service(plan, mod)}
    if info.name == "ollama":  # a one-shot job that creates the model once the server is healthy
        services["ollama-create"] = {
            "image": info.image,
            "command": ["create", client_model(plan, mod), "-f", "/config/Modelfile"],
            "environment": {"OLLAMA_HOST": f"{info.name}:{info.container_port}"},
            "volumes": services[info.name]["volumes"],
            "depends_on": {info.name: {"condition": "service_healthy"}},
        }
    doc = {"name": f"{info.name}-server", "services": services, "volumes": {"hf-cache": {}}}
    header = (
        f"# {info.title} {info.version} with Docker Compose: `docker compose up -d`, then the API is on "
        f"http://{plan.options.host}:{plan.options.port}{info.api_base}\n"
    )
    return header + dump_yaml(doc)
