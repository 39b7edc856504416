"""Kubernetes manifests: a PVC for the Hugging Face cache, a Deployment (or a LeaderWorkerSet across
nodes) and a Service.

Secrets are referenced, never written: `kubectl create secret generic hf-token --from-literal=token=...`.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from backend.export.base import dump_yaml_all, k8s_token, shell_command
from backend.export.engine import Unsupported
from backend.export.plan import ExportPlan
from backend.export.scripts import HF_CACHE, env_names


def env_list(plan: ExportPlan, mod: ModuleType, argv: list) -> list[dict]:
    env = [
        {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}},
        }
    ]
    secret = f"{mod.INFO.name}-api-key"
    env += [
        {"name": n, "valueFrom": {"secretKeyRef": {"name": secret, "key": "key"}}} for n in env_names(argv)
    ]
    if hasattr(mod, "environment"):
        extra = mod.environment(plan, "0.0.0.0", mod.INFO.container_port)
        env += [{"name": name, "value": value} for name, value in extra.items()]
    return env


def probe(mod: ModuleType, period: int, failures: int) -> dict:
    get = {"path": mod.INFO.health_path, "port": mod.INFO.container_port}
    return {"httpGet": get, "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 5}


def pod_spec(plan: ExportPlan, mod: ModuleType, gpus: int, container: dict) -> dict:
    name = mod.INFO.name
    container["resources"] = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
    mounts = [{"name": "hf-cache", "mountPath": HF_CACHE}, {"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict] = [
        {"name": "hf-cache", "persistentVolumeClaim": {"claimName": f"{name}-hf-cache"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
    ]
    if plan.local:
        folder = str(Path(plan.model).parent) if plan.model.endswith(".gguf") else plan.model
        mounts.append({"name": "model", "mountPath": folder, "readOnly": True})
        volumes.append({"name": "model", "hostPath": {"path": folder, "type": "Directory"}})
    if hasattr(mod, "extra_files"):
        container["workingDir"] = "/config"
        mounts.append({"name": "config", "mountPath": "/config", "readOnly": True})
        volumes.append({"name": "config", "configMap": {"name": f"{name}-config"}})
    container["volumeMounts"] = mounts
    return {"containers": [container], "volumes": volumes}


def server_container(plan: ExportPlan, mod: ModuleType) -> dict:
    info = mod.INFO
    argv = mod.command(plan, "0.0.0.0", info.container_port)
    container: dict = {"name": info.name, "image": info.image}
    if info.entrypoint:
        container["args"] = [k8s_token(t) for t in argv[len(info.entrypoint) :]]
    else:
        container["command"] = [k8s_token(t) for t in argv]
    container["ports"] = [{"name": "http", "containerPort": info.container_port}]
    container["env"] = env_list(plan, mod, argv)
    container["startupProbe"] = probe(mod, 10, 180)  # up to 30 minutes to download and load weights
    container["readinessProbe"] = probe(mod, 10, 3)
    container["livenessProbe"] = probe(mod, 30, 3)
    return container


def lws(plan: ExportPlan, mod: ModuleType) -> dict:
    """vLLM across nodes: a LeaderWorkerSet whose leader starts the Ray head and `vllm serve`."""
    per_node = plan.options.gpus_per_node
    if plan.gpus_per_replica % per_node or plan.dp > 1:
        raise Unsupported(
            f"across nodes tp x pp ({plan.gpus_per_replica}) must fill whole nodes of {per_node} GPUs "
            "and dp must be 1; change tp/pp or gpus_per_node"
        )
    name = mod.INFO.name
    leader = server_container(plan, mod)
    serve = shell_command(mod.command(plan, "0.0.0.0", mod.INFO.container_port), indent="")
    leader.pop("args", None)
    leader["command"] = ["sh", "-c", "ray start --head --port=6379 && " + serve.replace("$(", "$$(")]
    worker = {"name": name, "image": mod.INFO.image, "env": leader["env"]}
    worker["command"] = ["sh", "-c", "ray start --block --address=$(LWS_LEADER_ADDRESS):6379"]
    labels = {"app": name}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": plan.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": {**labels, "role": "leader"}},
                    "spec": pod_spec(plan, mod, per_node, leader),
                },
                "workerTemplate": {"spec": pod_spec(plan, mod, per_node, worker)},
            },
        },
    }


def k8s_yml(plan: ExportPlan, mod: ModuleType) -> str:
    info = mod.INFO
    if info.image is None:
        raise Unsupported(f"{info.title} ships no container image; use the shell or skypilot format")
    name = info.name
    docs: list[dict] = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": f"{name}-hf-cache"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "200Gi"}}},
        }
    ]
    if hasattr(mod, "extra_files"):
        data = mod.extra_files(plan)
        docs.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-config"}, "data": data}
        )
    selector = {"app": name}
    if plan.nodes > 1:
        if not info.multi_node:
            raise Unsupported(
                f"tp x pp = {plan.gpus_per_replica} GPUs exceeds one node ({plan.options.gpus_per_node}); "
                f"{info.title} is exported for one node only: use vLLM (LeaderWorkerSet) or lower tp/pp"
            )
        docs.append(lws(plan, mod))
        selector = {"app": name, "role": "leader"}
    else:
        gpus = plan.gpus_per_replica * (plan.dp if info.native_dp else 1)
        if gpus > plan.options.gpus_per_node:
            raise Unsupported(
                f"{gpus} GPUs in one pod exceed gpus_per_node={plan.options.gpus_per_node}; lower dp"
            )
        replicas = 1 if info.native_dp else plan.dp
        template = {
            "metadata": {"labels": selector},
            "spec": pod_spec(plan, mod, gpus, server_container(plan, mod)),
        }
        docs.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "labels": selector},
                "spec": {"replicas": replicas, "selector": {"matchLabels": selector}, "template": template},
            }
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
    if env_names(mod.command(plan, "0.0.0.0", info.container_port)):
        header += f"# API key: kubectl create secret generic {name}-api-key --from-literal=key=$YOUR_KEY\n"
    return header + dump_yaml_all(docs)
