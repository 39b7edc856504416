"""Kubernetes manifests: a PVC for the engine's cache, a Deployment (or a LeaderWorkerSet across nodes) and a
Service.

A LeaderWorkerSet's pods run on different nodes, so they cannot share one ReadWriteOnce claim: each pod
keeps its own cache (an emptyDir). Secrets are referenced, never written:
`kubectl create secret generic hf-token --from-literal=token=...`.
"""

from __future__ import annotations

import shlex

from backend.export.base import EnvRef, dump_yaml_all, k8s_token, shell_command
from backend.export.engine import Exporter, Unsupported
from backend.export.plan import ExportPlan

CACHE_SIZE = "200Gi"


def secret_env(name: str, secret: str, key: str, optional: bool = False) -> dict:
    ref: dict[str, str | bool] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def env_list(plan: ExportPlan, engine: Exporter, argv: list) -> list[dict]:
    info = engine.INFO
    env = [secret_env("HF_TOKEN", "hf-token", "token", optional=True)]
    secret = f"{info.name}-api-key"
    env += [secret_env(token.name, secret, "key") for token in argv if isinstance(token, EnvRef)]
    for name, value in engine.environment(plan, "0.0.0.0", info.container_port).items():
        env.append(
            secret_env(name, secret, "key") if isinstance(value, EnvRef) else {"name": name, "value": value}
        )
    return env


def probe(engine: Exporter, period: int, failures: int) -> dict:
    get = {"path": engine.INFO.health_path, "port": engine.INFO.container_port}
    return {"httpGet": get, "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 5}


def pod_spec(plan: ExportPlan, engine: Exporter, gpus: int, container: dict, shared_cache: bool) -> dict:
    info = engine.INFO
    container["resources"] = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
    mounts: list[dict] = [
        {"name": "cache", "mountPath": info.cache_dir},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    cache = (
        {"persistentVolumeClaim": {"claimName": f"{info.name}-cache"}}
        if shared_cache
        else {"emptyDir": {"sizeLimit": CACHE_SIZE}}
    )
    volumes: list[dict] = [
        {"name": "cache", **cache},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
    ]
    if folder := plan.local_model_dir:
        mounts.append({"name": "model", "mountPath": folder, "readOnly": True})
        volumes.append({"name": "model", "hostPath": {"path": folder, "type": "Directory"}})
    if engine.extra_files(plan):
        container["workingDir"] = "/config"
        mounts.append({"name": "config", "mountPath": "/config", "readOnly": True})
        volumes.append({"name": "config", "configMap": {"name": f"{info.name}-config"}})
    container["volumeMounts"] = mounts
    return {"containers": [container], "volumes": volumes}


def server_container(plan: ExportPlan, engine: Exporter) -> dict:
    info = engine.INFO
    container: dict = {"name": info.name, "image": info.image}
    if info.entrypoint:
        container["args"] = [k8s_token(t) for t in engine.container_args(plan)]
    else:
        container["command"] = [k8s_token(t) for t in engine.container_args(plan)]
    container["ports"] = [{"name": "http", "containerPort": info.container_port}]
    container["env"] = env_list(plan, engine, engine.container_args(plan))
    container["startupProbe"] = probe(engine, 10, 180)  # up to 30 minutes to download and load weights
    container["readinessProbe"] = probe(engine, 10, 3)
    container["livenessProbe"] = probe(engine, 30, 3)
    if steps := engine.post_start(plan):
        ready = shlex.join(engine.ready_check())
        script = f"until {ready} >/dev/null 2>&1; do sleep 1; done; " + "; ".join(map(shlex.join, steps))
        container["lifecycle"] = {"postStart": {"exec": {"command": ["sh", "-c", script]}}}
    return container


def lws(plan: ExportPlan, engine: Exporter) -> dict:
    """vLLM across nodes: a LeaderWorkerSet whose leader starts the Ray head and `vllm serve`."""
    info = engine.INFO
    per_node = plan.options.gpus_per_node
    if plan.gpus_per_replica % per_node or plan.dp > 1:
        raise Unsupported(
            f"across nodes tp x pp ({plan.gpus_per_replica}) must fill whole nodes of {per_node} GPUs "
            "and dp must be 1; change tp/pp or gpus_per_node"
        )
    leader = server_container(plan, engine)
    serve = shell_command(engine.command(plan, "0.0.0.0", info.container_port), indent="")
    leader.pop("args", None)
    leader["command"] = ["sh", "-c", "ray start --head --port=6379 && " + serve.replace("$(", "$$(")]
    worker = {"name": info.name, "image": info.image, "env": leader["env"]}
    worker["command"] = ["sh", "-c", "ray start --block --address=$(LWS_LEADER_ADDRESS):6379"]
    labels = {"app": info.name}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": info.name, "labels": labels},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": plan.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": {**labels, "role": "leader"}},
                    "spec": pod_spec(plan, engine, per_node, leader, shared_cache=False),
                },
                "workerTemplate": {"spec": pod_spec(plan, engine, per_node, worker, shared_cache=False)},
            },
        },
    }


def deployment(plan: ExportPlan, engine: Exporter, selector: dict) -> dict:
    info = engine.INFO
    gpus = plan.container_gpus(info.native_dp)
    if gpus > plan.options.gpus_per_node:
        raise Unsupported(
            f"{gpus} GPUs in one pod exceed gpus_per_node={plan.options.gpus_per_node}; lower dp"
        )
    replicas = 1 if info.native_dp else plan.dp
    # replicas of one Deployment share the claim only on one node: each replica > 1 gets its own cache
    spec = pod_spec(plan, engine, gpus, server_container(plan, engine), shared_cache=replicas == 1)
    template = {"metadata": {"labels": selector}, "spec": spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": info.name, "labels": selector},
        "spec": {"replicas": replicas, "selector": {"matchLabels": selector}, "template": template},
    }


def k8s_yml(plan: ExportPlan, engine: Exporter) -> str:
    info = engine.INFO
    if info.image is None:
        raise Unsupported(f"{info.title} ships no container image; use the shell or skypilot format")
    name = info.name
    docs: list[dict] = []
    if extra := engine.extra_files(plan):
        docs.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-config"}, "data": extra}
        )
    selector = {"app": name}
    if plan.nodes > 1:
        if not info.multi_node:
            raise Unsupported(
                f"tp x pp = {plan.gpus_per_replica} GPUs exceeds one node ({plan.options.gpus_per_node}); "
                f"{info.title} is exported for one node only: use vLLM (LeaderWorkerSet) or lower tp/pp"
            )
        docs.append(lws(plan, engine))
        selector = {"app": name, "role": "leader"}
    else:
        docs.append(deployment(plan, engine, selector))
    if plan.nodes == 1 and (info.native_dp or plan.dp == 1):  # one pod: it keeps its cache on a claim
        claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": CACHE_SIZE}}}
        docs.insert(
            0,
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": f"{name}-cache"},
                "spec": claim,
            },
        )
    port = {"name": "http", "port": plan.options.port, "targetPort": info.container_port}
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {"type": "ClusterIP", "selector": selector, "ports": [port]},
        }
    )
    header = (
        f"# {info.title} {info.version} on Kubernetes: kubectl apply -f k8s.yaml\n"
        "# Optional Hub token: kubectl create secret generic hf-token --from-literal=token=$HF_TOKEN\n"
    )
    if plan.options.api_key_env and (
        info.api_key_env or any(isinstance(t, EnvRef) for t in engine.container_args(plan))
    ):
        header += f"# API key: kubectl create secret generic {name}-api-key --from-literal=key=$YOUR_KEY\n"
    return header + dump_yaml_all(docs)
