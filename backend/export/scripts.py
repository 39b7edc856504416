"""Per-engine files: launch.sh (shell), docker.sh (docker), python.py (python) and the client snippets."""

from __future__ import annotations

import json
import shlex

from backend.export.base import EnvRef, Raw, Token, env_names, shell_command, shell_script, shell_token
from backend.export.engine import Exporter, Unsupported
from backend.export.plan import ExportPlan


def single_node(plan: ExportPlan, what: str) -> None:
    if plan.nodes > 1:
        raise Unsupported(
            f"{what} runs on one machine, but tp x pp = {plan.gpus_per_replica} GPUs exceeds gpus_per_node="
            f"{plan.options.gpus_per_node}; use the k8s or skypilot format with vLLM, lower tp/pp, or raise "
            "gpus_per_node if your machine has more GPUs"
        )


def token_env(plan: ExportPlan) -> list[str]:
    """Shell lines that pass the Hub token under the name engines read (HF_TOKEN), if the user's differs."""
    name = plan.options.hf_token_env
    return [] if name == "HF_TOKEN" else [f'export HF_TOKEN="${{{name}:-}}"']


def export_lines(env: dict[str, str | EnvRef]) -> list[str]:
    """`export NAME=value` lines; an EnvRef copies another variable and stops the script when it is unset."""
    return [
        f"export {name}={shell_token(value) if isinstance(value, EnvRef) else shlex.quote(value)}"
        for name, value in env.items()
    ]


def wait_and_run(ready: list[str], steps: list[list[str]], prefix: list[str]) -> list[str]:
    """Lines that wait until `ready` succeeds, then run each post-start step (both after `prefix`)."""
    if not steps:
        return []
    lines = [f"until {shell_command([*prefix, *ready])} >/dev/null 2>&1; do sleep 1; done"]
    return lines + [shell_command([*prefix, *step]) for step in steps]


def launch_sh(plan: ExportPlan, engine: Exporter) -> str:
    info = engine.INFO
    single_node(plan, "launch.sh")
    lines = token_env(plan)
    if engine.extra_files(plan):
        lines.append('cd "$(dirname "$0")"')
    lines += export_lines(engine.environment(plan, plan.options.host, plan.options.port))
    command = shell_command(engine.command(plan, plan.options.host, plan.options.port))
    where = "Run from the project root." if info.runs_in_checkout else "Needs the engine installed."
    comment = f"Launch {info.title} {info.version} as planned. {where}"
    steps = engine.post_start(plan)
    if steps:
        lines += [command + " &", *wait_and_run(engine.ready_check(), steps, []), "wait"]
    else:
        lines.append(command)
    return shell_script(["\n".join(lines)], comment)


def docker_sh(plan: ExportPlan, engine: Exporter) -> str:
    info = engine.INFO
    if info.image is None:
        raise Unsupported(f"{info.title} ships no container image; use the shell or python format")
    single_node(plan, "docker.sh")
    argv = engine.container_args(plan)
    env = engine.environment(plan, "0.0.0.0", info.container_port)
    steps = engine.post_start(plan)
    container = f"{info.name}-server"
    run: list[Token] = ["docker", "run", "-d" if steps else "--rm", "--name", container]
    run += ["--gpus", str(plan.container_gpus(info.native_dp)), *info.container_opts]
    run += ["-p", f"{plan.options.host}:{plan.options.port}:{info.container_port}"]
    run += ["-v", Raw(f"{shell_token(info.name + '-cache')}:{info.cache_dir}"), "-e", "HF_TOKEN"]
    run += [item for name in env_names(argv) for item in ("-e", name)]
    for name, value in env.items():  # values exported above the command are passed by name
        run += ["-e", name if isinstance(value, EnvRef) else f"{name}={value}"]
    run += local_model_mount(plan)
    if engine.extra_files(plan):
        run += ["-w", "/config"]
        run += [
            arg
            for name in engine.extra_files(plan)
            for arg in ("-v", Raw(f'"$PWD/{name}":/config/{name}:ro'))
        ]
    commands = [shell_command([*run, info.image, *argv])]
    commands += wait_and_run(engine.ready_check(), steps, ["docker", "exec", container])
    pre = token_env(plan) + (['cd "$(dirname "$0")"'] if engine.extra_files(plan) else [])
    pre += export_lines({k: v for k, v in env.items() if isinstance(v, EnvRef)})
    comment = (
        f"Run {info.title} {info.version} in its official image ({info.image}), port {plan.options.port}.\n"
        f"Weights stay in the docker volume {info.name}-cache between runs."
    )
    return shell_script(["\n".join(pre), *commands] if pre else commands, comment)


def local_model_mount(plan: ExportPlan) -> list[Token]:
    """`-v dir:dir:ro` for a local model (its folder, or the folder holding the .gguf file)."""
    folder = plan.local_model_dir
    if folder is None:
        return []
    if ":" in folder or "," in folder:
        raise Unsupported(f"a container cannot mount the path {folder!r}: rename it without ':' or ','")
    return ["-v", f"{folder}:{folder}:ro"]


def python_py(plan: ExportPlan, engine: Exporter) -> str:
    return engine.python_snippet(plan)


def base_url(plan: ExportPlan, engine: Exporter) -> str:
    host = "127.0.0.1" if plan.options.host in ("0.0.0.0", "::") else plan.options.host
    return f"http://{host}:{plan.options.port}{engine.INFO.api_base}"


def client_sh(plan: ExportPlan, engine: Exporter) -> str:
    body = {
        "model": engine.client_model(plan),
        "messages": [{"role": "user", "content": "Say hello in one sentence."}],
        "max_tokens": 64,
    }
    argv: list[Token] = ["curl", "-sS", f"{base_url(plan, engine)}/chat/completions"]
    argv += ["-H", "Content-Type: application/json"]
    if key := plan.options.api_key_env:
        argv += ["-H", Raw(f'"Authorization: Bearer ${{{key}:?set {key} first}}"')]
    argv += ["-d", json.dumps(body)]
    return shell_script([shell_command(argv)], f"Ask the {engine.INFO.title} server for a chat completion.")


def client_py(plan: ExportPlan, engine: Exporter) -> str:
    key = f"os.environ[{plan.options.api_key_env!r}]" if plan.options.api_key_env else '"EMPTY"'
    return (
        f'"""Chat with the {engine.INFO.title} server through the openai client (pip install openai)."""\n\n'
        "import os\n\n"
        "from openai import OpenAI\n\n"
        f"base_url = os.environ.get('OPENAI_BASE_URL', {base_url(plan, engine)!r})\n"
        f"client = OpenAI(base_url=base_url, api_key={key})\n"
        "reply = client.chat.completions.create(\n"
        f"    model={engine.client_model(plan)!r},\n"
        '    messages=[{"role": "user", "content": "Say hello in one sentence."}],\n'
        "    max_tokens=64,\n"
        ")\n"
        "print(reply.choices[0].message.content)\n"
    )
