"""Per-engine files: launch.sh (shell), docker.sh (docker), python.py (python) and the client snippets."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import ModuleType

from backend.export.base import EnvRef, Raw, Token, shell_command, shell_script
from backend.export.engine import Unsupported, served_name
from backend.export.plan import ExportPlan

HF_CACHE = "/root/.cache/huggingface"


def client_model(plan: ExportPlan, mod: ModuleType) -> str:
    custom = getattr(mod, "client_model", None)
    return custom(plan) if custom else served_name(plan, mod.INFO)


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


def launch_sh(plan: ExportPlan, mod: ModuleType) -> str:
    info = mod.INFO
    single_node(plan, "launch.sh")
    lines = token_env(plan)
    if hasattr(mod, "extra_files"):
        lines.append('cd "$(dirname "$0")"')
    env = mod.environment(plan, plan.options.host, plan.options.port) if hasattr(mod, "environment") else {}
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    command = shell_command(mod.command(plan, plan.options.host, plan.options.port))
    where = "Run from the project root." if info.name == "embedded" else "Needs the engine installed."
    comment = f"Launch {info.title} {info.version} as planned. {where}"
    if info.name == "ollama":
        name = shlex.quote(client_model(plan, mod))
        lines += [
            command + " &",
            "until ollama list >/dev/null 2>&1; do sleep 1; done",
            f"ollama create {name} -f Modelfile",
            "wait",
        ]
        return shell_script(["\n".join(lines)], comment)
    return shell_script(["\n".join([*lines, command])] if lines else [command], comment)


def docker_sh(plan: ExportPlan, mod: ModuleType) -> str:
    info = mod.INFO
    if info.image is None:
        raise Unsupported(f"{info.title} ships no container image; use the shell or python format")
    single_node(plan, "docker.sh")
    argv = mod.command(plan, "0.0.0.0", info.container_port)
    argv = argv[len(info.entrypoint) :] if info.entrypoint else argv
    run: list[Token] = ["docker", "run", "--rm", "--name", f"{info.name}-server"]
    run += ["--gpus", str(plan.gpus_per_replica * (plan.dp if info.native_dp else 1)), *info.container_opts]
    run += ["-p", f"{plan.options.host}:{plan.options.port}:{info.container_port}"]
    run += ["-v", Raw(f'"${{HF_HOME:-$HOME/.cache/huggingface}}":{HF_CACHE}'), "-e", "HF_TOKEN"]
    run += [item for name in env_names(argv) for item in ("-e", name)]
    env = mod.environment(plan, "0.0.0.0", info.container_port) if hasattr(mod, "environment") else {}
    run += [item for name, value in env.items() for item in ("-e", f"{name}={value}")]
    run += local_model_mount(plan)
    if hasattr(mod, "extra_files"):
        run += ["-w", "/config"]
        run += [
            arg for name in mod.extra_files(plan) for arg in ("-v", Raw(f'"$PWD/{name}":/config/{name}:ro'))
        ]
    if info.name == "ollama":
        run[2] = "-d"
        run += [info.image, *argv]
        create = ["docker", "exec", f"{info.name}-server", "ollama", "create", client_model(plan, mod)]
        create += ["-f", "/config/Modelfile"]
        wait = ["docker", "exec", f"{info.name}-server", "ollama", "list"]
        commands = [shell_command(run), f"until {shell_command(wait)} >/dev/null 2>&1; do sleep 1; done"]
        commands.append(shell_command(create))
    else:
        commands = [shell_command([*run, info.image, *argv])]
    pre = token_env(plan) + (['cd "$(dirname "$0")"'] if hasattr(mod, "extra_files") else [])
    comment = (
        f"Run {info.title} {info.version} in its official image ({info.image}), port {plan.options.port}."
    )
    return shell_script(["\n".join(pre), *commands] if pre else commands, comment)


def env_names(argv: list[Token]) -> list[str]:
    return [token.name for token in argv if isinstance(token, EnvRef)]


def local_model_mount(plan: ExportPlan) -> list[Token]:
    """`-v dir:dir:ro` for a local model (its folder, or the folder holding the .gguf file)."""
    if not plan.local:
        return []
    if ":" in plan.model or "," in plan.model:
        raise Unsupported(f"a container cannot mount the path {plan.model!r}: rename it without ':' or ','")
    folder = str(Path(plan.model).parent) if plan.model.endswith(".gguf") else plan.model
    return ["-v", f"{folder}:{folder}:ro"]


def python_py(plan: ExportPlan, mod: ModuleType) -> str:
    if not hasattr(mod, "python_snippet"):
        raise Unsupported(f"{mod.INFO.title} has no Python API export; use the shell or docker format")
    return mod.python_snippet(plan)


def base_url(plan: ExportPlan, mod: ModuleType) -> str:
    host = "127.0.0.1" if plan.options.host in ("0.0.0.0", "::") else plan.options.host
    return f"http://{host}:{plan.options.port}{mod.INFO.api_base}"


def client_sh(plan: ExportPlan, mod: ModuleType) -> str:
    body = {
        "model": client_model(plan, mod),
        "messages": [{"role": "user", "content": "Say hello in one sentence."}],
        "max_tokens": 64,
    }
    argv: list[Token] = ["curl", "-sS", f"{base_url(plan, mod)}/chat/completions"]
    argv += ["-H", "Content-Type: application/json"]
    if key := plan.options.api_key_env:
        argv += ["-H", Raw(f'"Authorization: Bearer ${{{key}:?set {key} first}}"')]
    argv += ["-d", json.dumps(body)]
    return shell_script([shell_command(argv)], f"Ask the {mod.INFO.title} server for a chat completion.")


def client_py(plan: ExportPlan, mod: ModuleType) -> str:
    key = f"os.environ[{plan.options.api_key_env!r}]" if plan.options.api_key_env else '"EMPTY"'
    return (
        f'"""Chat with the {mod.INFO.title} server through the openai client (pip install openai)."""\n\n'
        "import os\n\n"
        "from openai import OpenAI\n\n"
        f"base_url = os.environ.get('OPENAI_BASE_URL', {base_url(plan, mod)!r})\n"
        f"client = OpenAI(base_url=base_url, api_key={key})\n"
        "reply = client.chat.completions.create(\n"
        f"    model={client_model(plan, mod)!r},\n"
        '    messages=[{"role": "user", "content": "Say hello in one sentence."}],\n'
        "    max_tokens=64,\n"
        ")\n"
        "print(reply.choices[0].message.content)\n"
    )
