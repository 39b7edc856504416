"""SkyPilot task YAML (`sky launch -c NAME skypilot.yaml`): the engine on any cloud, one or more nodes."""

from __future__ import annotations

from backend.export.base import dump_yaml, shell_command
from backend.export.engine import Exporter, Unsupported
from backend.export.plan import ExportPlan
from backend.export.scripts import export_lines, wait_and_run

# The planner's GPU short names -> SkyPilot accelerator names.
ACCELERATORS = {
    "H100-80GB": "H100", "H100": "H100", "H100-PCIE": "H100", "H200": "H200", "B200": "B200",
    "A100-80GB": "A100-80GB", "A100-40GB": "A100", "A100": "A100", "L40S": "L40S", "L4": "L4",
    "A10G": "A10G", "T4": "T4", "RTX4090": "RTX4090", "MI300X": "MI300X",
}  # fmt: skip
# vLLM no longer depends on Ray; multi-node tasks install it (vLLM's multi-node docs use ray[default]).
RAY = 'pip install "ray[default]==2.60.0"'


def accelerator(gpu: str) -> str:
    """SkyPilot's name for the planner's GPU (RTX-4090 -> RTX4090); Unsupported for a CPU plan."""
    if gpu.upper() == "CPU":
        raise Unsupported("the plan runs on CPU; choose a GPU for a GPU engine, or the embedded engine")
    return ACCELERATORS.get(gpu.upper(), gpu.upper().replace("-", ""))


def run_script(plan: ExportPlan, engine: Exporter) -> str:
    env = engine.environment(plan, "0.0.0.0", plan.options.port)
    serve = "\n".join([*export_lines(env), shell_command(engine.command(plan, "0.0.0.0", plan.options.port))])
    if plan.nodes == 1:
        steps = engine.post_start(plan)
        if steps:
            return "\n".join([serve + " &", *wait_and_run(engine.ready_check(), steps, []), "wait"]) + "\n"
        return serve + "\n"
    return (
        'head=$(echo "$SKYPILOT_NODE_IPS" | head -n1)\n'
        'if [ "$SKYPILOT_NODE_RANK" = "0" ]; then\n'
        "  ray start --head --port=6379\n"
        f'  until [ "$(ray list nodes 2>/dev/null | grep -c ALIVE)" -ge {plan.nodes} ]; do sleep 5; done\n'
        + "".join(f"  {line}\n" for line in serve.splitlines())
        + "else\n"
        '  ray start --block --address="$head:6379"\n'
        "fi\n"
    )


def skypilot_yml(plan: ExportPlan, engine: Exporter) -> str:
    info = engine.INFO
    if not info.pip and not info.vm_image:
        raise Unsupported(f"{info.title} is not exported for SkyPilot; use the docker, compose or k8s format")
    if plan.nodes > 1 and not info.multi_node:
        raise Unsupported(
            f"tp x pp = {plan.gpus_per_replica} GPUs exceeds one node ({plan.options.gpus_per_node}); "
            f"{info.title} is exported for one node only: use vLLM or lower tp/pp"
        )
    if plan.nodes > 1 and (plan.gpus_per_replica % plan.options.gpus_per_node or plan.dp > 1):
        raise Unsupported(
            f"across nodes tp x pp must fill whole nodes of {plan.options.gpus_per_node} GPUs, with dp=1"
        )
    gpus = plan.container_gpus(info.native_dp) if plan.nodes == 1 else plan.options.gpus_per_node
    resources: dict = {"ports": plan.options.port}
    if info.uses_gpu:
        resources["accelerators"] = f"{accelerator(plan.req.gpu)}:{gpus}"
    else:
        resources["cpus"] = "4+"
    if info.vm_image:
        resources["image_id"] = f"docker:{info.image}"
    task: dict = {"name": f"{info.name}-server", "resources": resources, "num_nodes": plan.nodes}
    if info.runs_in_checkout or engine.extra_files(plan):
        # SkyPilot uploads the folder `sky launch` runs in: the project root (embedded engine) or this
        # export folder, which holds the files the command reads
        task["workdir"] = "."
    secrets = [plan.options.hf_token_env] + ([plan.options.api_key_env] if plan.options.api_key_env else [])
    task["secrets"] = dict.fromkeys(secrets)
    setup = [info.pip] if info.pip else []
    if plan.nodes > 1:
        setup.append(RAY)
    if setup:
        task["setup"] = "\n".join(setup) + "\n"
    run = run_script(plan, engine)
    if plan.options.hf_token_env != "HF_TOKEN":
        run = f'export HF_TOKEN="${{{plan.options.hf_token_env}:-}}"\n' + run
    task["run"] = run
    where = "from this folder " if task.get("workdir") and not info.runs_in_checkout else ""
    flags = " ".join(f"--secret {name}" for name in secrets)
    header = f"# {info.title} {info.version} with SkyPilot: {where}sky launch -c {info.name} skypilot.yaml"
    header += f" {flags}\n"
    return header + dump_yaml(task)
