"""Hugging Face Inference Endpoints payload: the JSON body `HfApi.create_inference_endpoint` sends.

The engine runs as a custom container; Endpoints downloads the repository to /repository and guards the
URL with Hugging Face tokens, so no API key is passed.
"""

from __future__ import annotations

import dataclasses
import json
import re

from backend.export.base import EnvRef
from backend.export.engine import Exporter, Unsupported
from backend.export.plan import ExportPlan

INSTANCE_TYPES = {"T4": "nvidia-t4", "L4": "nvidia-l4", "A10G": "nvidia-a10g", "L40S": "nvidia-l40s",
                  "A100": "nvidia-a100", "H100": "nvidia-h100", "H200": "nvidia-h200"}  # fmt: skip
SIZES = {1: "x1", 2: "x2", 4: "x4", 8: "x8"}


def instance(plan: ExportPlan) -> tuple[str, str]:
    family = plan.req.gpu.upper().split("-")[0]
    if family not in INSTANCE_TYPES:
        raise Unsupported(
            f"Inference Endpoints offer no {plan.req.gpu}; choose one of {', '.join(INSTANCE_TYPES)}"
        )
    if plan.gpus_per_replica not in SIZES:
        raise Unsupported(
            f"Inference Endpoints instances have 1, 2, 4 or 8 GPUs, the plan needs {plan.gpus_per_replica}; "
            "change tp x pp to one of those, or use the k8s format"
        )
    return INSTANCE_TYPES[family], SIZES[plan.gpus_per_replica]


def endpoint_json(plan: ExportPlan, engine: Exporter) -> str:
    info = engine.INFO
    if not info.hf_endpoint:
        raise Unsupported(
            f"{info.title} is not exported as an Inference Endpoint; use vLLM, SGLang, TGI or llama.cpp"
        )
    if plan.local:
        raise Unsupported("Inference Endpoints serve a Hub repository; push the local model to the Hub first")
    instance_type, size = instance(plan)
    # Endpoints download the repository to /repository; GGUF engines pick their file from the Hub themselves
    container = (
        plan if plan.quant == "gguf" else dataclasses.replace(plan, checkpoint="/repository", local=True)
    )
    argv = engine.container_args(container)
    # drop the API key flag and its value: the endpoint is guarded by Hugging Face tokens instead
    args = [
        token
        for i, token in enumerate(argv)
        if not isinstance(token, EnvRef) and not (i + 1 < len(argv) and isinstance(argv[i + 1], EnvRef))
    ]
    name = re.sub(r"[^a-z0-9-]+", "-", plan.served_name.lower()).strip("-")[:32].strip("-") or "llm"
    payload = {
        "compute": {
            "accelerator": "gpu",
            "instanceSize": size,
            "instanceType": instance_type,
            "scaling": {"maxReplica": plan.dp, "minReplica": 1, "scaleToZeroTimeout": None},
        },
        "model": {
            "framework": "pytorch",
            "repository": plan.checkpoint,
            "revision": plan.req.revision,
            "image": {
                "custom": {"url": info.image, "health_route": info.health_path, "port": info.container_port}
            },
            "task": "text-generation",
            "args": args,
        },
        "name": name,
        "provider": {"region": "us-east-1", "vendor": "aws"},
        "type": "authenticated",
    }
    return json.dumps(payload, indent=2) + "\n"
