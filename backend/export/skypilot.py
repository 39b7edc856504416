"""SkyPilot task YAML (`sky launch -c NAME skypilot.yaml`): the engine on any cloud, one or more nodes."""

from __future__ import annotations

from types import ModuleType

from backend.export.base import dump_yaml, shell_command
from backend.export.engine import Unsupported
from backend.export.plan import ExportPlan

# The planner's GPU short names -> SkyPilot accelerator names.
ACCELERATORS = {
    "H100-80GB": "H100", "H100": "H100", "H100-PCIE": "H100", "H200": "H200", "B200": "B200",
    "A100-80GB": "A100-80GB", "A100-40GB": "A100", "A100": "A100", "L40S": "L40S", "L4": "L4",
    "A10G": "A10G", "T4": "T4", "RTX4090": "RTX4090", "MI300X": "MI300X",
}  # fmt: skip


def accelerator(gpu: str) -> str:
    """SkyPilot's name for the planner's GPU (RTX-4090 -> RTX4090); Unsupported for a CPU plan."""
    if gpu.upper() == "CPU":
        raise Unsupported("the plan runs on CPU; choose a GPU for a GPU engine, or the embedded engine")
    return ACCELERATORS.get(gpu.upper(), gpu.upper().replace("-", ""))


def run_script(plan: ExportPlan, mod: ModuleType) -> str:
    serve = shell_command(mod.command(plan, "0.0.0.0", plan.options.port))
    if plan.nodes == 1:
        return serve + "\n"
    return (
        'head=$(echo "$SKYPILOT_NODE_IPS" | head -n1)\n'
        'if [ "$SKYPILOT_NODE_RANK" = "0" ]; then\n'
        "  ray start --head --port=6379\n"
        f'  until [ "$(ray list nodes 2>/dev/null | grep -c ALIVE)" -ge {plan.nodes} ]; do sleep 5; done\n'
        f"  {serve}\n"
        "else\n"
        '  ray start --block --address="$head:6379"\n'
        "fi\n"
    )


def skypilot_yml(plan: ExportPlan, mod: ModuleType) -> str:
    info = mod.INFO
    if not info.pip and info.name != "tgi":
        raise Unsupported(f"{info.title} is not exported for SkyPilot; use the docker, compose or k8s format")
    if plan.nodes > 1 and not info.multi_node:
        raise Unsupported(
            f"tp x pp = {plan.gpus_per_replica} GPUs exceeds one node ({plan.options.gpus_per_node}); "
            f"{info.title} is exported for one node only: use vLLM or lower tp/pp"
        )
    if plan.nodes > 1 and plan.gpus_per_replica % plan.options.gpus_per_node:
        raise Unsupported(f"across nodes tp x pp must fill whole nodes of {plan.options.gpus_per_node} GPUs")
    gpus = min(plan.gpus_per_replica, plan.options.gpus_per_node) * (plan.dp if info.native_dp else 1)
    resources: dict = {"ports": plan.options.port}
    if info.uses_gpu:
        resources["accelerators"] = f"{accelerator(plan.req.gpu)}:{gpus}"
    else:
        resources["cpus"] = "4+"
    task: dict = {"name": f"{info.name}-server", "resources": resources, "num_nodes": plan.nodes}
    if info.name == "tgi":
        resources["image_id"] = f"docker:{info.image}"
    if info.name == "embedded":
        task["workdir"] = "."  # run `sky launch` from the project root: SkyPilot uploads the checkout
    secrets = {plan.options.hf_token_env: None}
    if plan.options.api_key_env:
        secrets[plan.options.api_key_env] = None
    task["secrets"] = secrets
    if info.pip:
        task["setup"] = info.pip + "\n"
    run = run_script(plan, mod)
    if plan.options.hf_token_env != "HF_TOKEN":
        run = f'export HF_TOKEN="${{{plan.options.hf_token_env}:-}}"\n' + run
    task["run"] = run
    header = (
        f"# {info.title} {info.version} with SkyPilot: "
        f"sky launch -c {info.name} skypilot.yaml --secret HF_TOKEN\n"
    )
    return header + dump_yaml(task)
