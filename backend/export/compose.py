"""docker-compose.yml (Compose specification): one service on one host, with a GPU reservation."""

from __future__ import annotations

from backend.export.base import EnvRef, compose_token, dump_yaml, env_names
from backend.export.engine import Exporter, Unsupported
from backend.export.plan import ExportPlan
from backend.export.scripts import single_node


def healthcheck(engine: Exporter) -> dict:
    test = ["CMD", *engine.ready_check()]
    return {"test": test, "interval": "30s", "timeout": "10s", "retries": 5, "start_period": "30m"}


def environment(plan: ExportPlan, engine: Exporter, argv: list) -> dict[str, str]:
    info = engine.INFO
    env = {"HF_TOKEN": f"${{{plan.options.hf_token_env}:-}}"}
    env |= {name: compose_token(EnvRef(name)) for name in env_names(argv)}
    extra = engine.environment(plan, "0.0.0.0", info.container_port)
    return env | {name: compose_token(value) for name, value in extra.items()}


def volumes(plan: ExportPlan, engine: Exporter) -> list:
    mounts: list = [f"{engine.INFO.name}-cache:{engine.INFO.cache_dir}"]
    if folder := plan.local_model_dir:
        mounts.append({"type": "bind", "source": folder, "target": folder, "read_only": True})
    mounts += [
        {"type": "bind", "source": f"./{name}", "target": f"/config/{name}", "read_only": True}
        for name in engine.extra_files(plan)
    ]
    return mounts


def service(plan: ExportPlan, engine: Exporter) -> dict:
    info = engine.INFO
    argv = engine.container_args(plan)
    svc: dict = {"image": info.image, "command": [compose_token(token) for token in argv]}
    svc["ports"] = [f"{plan.options.host}:{plan.options.port}:{info.container_port}"]
    svc["environment"] = environment(plan, engine, argv)
    if engine.extra_files(plan):
        svc["working_dir"] = "/config"
    svc["volumes"] = volumes(plan, engine)
    if "--ipc=host" in info.container_opts:
        svc["ipc"] = "host"
    else:
        svc["shm_size"] = "1g"
    if "--ulimit" in info.container_opts:
        svc["ulimits"] = {"memlock": -1, "stack": 67108864}
    devices = [{"driver": "nvidia", "count": plan.container_gpus(info.native_dp), "capabilities": ["gpu"]}]
    svc["deploy"] = {"resources": {"reservations": {"devices": devices}}}
    svc["healthcheck"] = healthcheck(engine)
    svc["restart"] = "unless-stopped"
    return svc


def post_start_services(plan: ExportPlan, engine: Exporter, server: dict) -> dict[str, dict]:
    """One-shot jobs that run each post-start step once the server is healthy (e.g. `ollama create`)."""
    info = engine.INFO
    jobs = {}
    for i, step in enumerate(engine.post_start(plan)):
        job: dict = {"image": info.image, "command": step[len(info.entrypoint) :]}
        env = engine.environment(plan, info.name, info.container_port)  # the server, seen from the job
        job["environment"] = {name: compose_token(value) for name, value in env.items()}
        job |= {"working_dir": server.get("working_dir", "/"), "volumes": server["volumes"]}
        job["depends_on"] = {info.name: {"condition": "service_healthy"}}
        jobs[f"{info.name}-post-start-{i + 1}"] = job
    return jobs


def compose_yml(plan: ExportPlan, engine: Exporter) -> str:
    info = engine.INFO
    if info.image is None:
        raise Unsupported(
            f"{info.title} ships no container image, so there is no compose file; use the shell format"
        )
    single_node(plan, "docker compose")
    gpus = plan.container_gpus(info.native_dp)
    if gpus > plan.options.gpus_per_node:
        raise Unsupported(
            f"compose runs on one host: {gpus} GPUs (tp x pp x dp) exceed "
            f"gpus_per_node={plan.options.gpus_per_node}; "
            "use the k8s format, lower dp, or raise gpus_per_node"
        )
    server = service(plan, engine)
    services = {info.name: server, **post_start_services(plan, engine, server)}
    doc = {"name": f"{info.name}-server", "services": services, "volumes": {f"{info.name}-cache": {}}}
    header = (
        f"# {info.title} {info.version} with Docker Compose: `docker compose up -d`, then the API is on "
        f"http://{plan.options.host}:{plan.options.port}{info.api_base}\n"
    )
    return header + dump_yaml(doc)
