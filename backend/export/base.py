"""What every exporter shares: the options, input validation and safe quoting for shell, YAML and Python."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml
from huggingface_hub.utils import HFValidationError, validate_repo_id

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HOST_NAME = re.compile(r"^[A-Za-z0-9.:_\[\]%]+$")
REVISION = re.compile(r"^[A-Za-z0-9._/][A-Za-z0-9._/-]*$")
SPECULATIVE_METHODS = ("ngram", "eagle3", "draft_model")
DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass(slots=True)
class ExportOptions:
    """How the exported server is reached and run; the plan (PlanRequest) says what it runs.

    Secrets are never values here: ``api_key_env`` and ``hf_token_env`` name environment variables that the
    generated files read at run time.
    """

    host: str = "127.0.0.1"  # address the launch command binds; containers bind 0.0.0.0 inside
    port: int = 8000
    served_model_name: str | None = None  # None = the model's name (a Hub id; a local file or folder's name)
    api_key_env: str | None = None  # e.g. "VLLM_API_KEY": clients must send this key
    hf_token_env: str = "HF_TOKEN"  # passed through (by name) to download gated models
    dtype: str = "auto"
    trust_remote_code: bool = False
    enable_metrics: bool = True
    speculative_method: str | None = None  # "ngram" | "eagle3" | "draft_model"
    speculative_model: str | None = None  # draft or EAGLE head (Hub id or path)
    num_speculative_tokens: int = 3
    gpus_per_node: int = 8  # above this many GPUs per replica the deployment spans nodes
    enforce_eager: bool = False  # vLLM/SGLang: no CUDA graphs or torch.compile (faster start, slower decode)


@dataclass(slots=True)
class EnvRef:
    """A command-line value read from an environment variable when the command runs (never written out)."""

    name: str


@dataclass(slots=True)
class Raw:
    """Shell text written verbatim: only ever built from constants and validated names, never user values."""

    text: str


Token = str | EnvRef | Raw


def has_control_chars(text: str) -> bool:
    return any(ord(ch) < 32 or ord(ch) == 127 for ch in text)


def check_text(what: str, value: str) -> str:
    """A free-text value that lands on a command line: one line, and not mistakable for a flag."""
    if not value:
        raise ValueError(f"{what} must not be empty")
    if has_control_chars(value):
        raise ValueError(f"{what} {value!r} contains a newline or control character; use a single-line value")
    if value.startswith("-"):
        raise ValueError(f"{what} {value!r} starts with '-', which an engine would read as a flag")
    return value


def is_local_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or Path(model).exists()


def check_model(what: str, model: str) -> str:
    """A local path (any single-line text) or a Hub id that satisfies huggingface_hub's rules."""
    check_text(what, model)
    if is_local_path(model):
        return model
    try:
        validate_repo_id(model)
    except HFValidationError as err:
        raise ValueError(
            f"{what} {model!r} is neither a local path (start it with / or ./) nor a valid Hugging Face "
            f"Hub id ('namespace/name'): {err}"
        ) from None
    return model


def check_env_name(what: str, name: str) -> str:
    if not ENV_NAME.match(name):
        raise ValueError(f"{what} must be an environment variable name like MY_API_KEY, got {name!r}")
    return name


def check_options(options: ExportOptions) -> None:
    if not HOST_NAME.match(options.host) or options.host.startswith("-"):
        raise ValueError(f"host must be an IP address or host name, got {options.host!r}")
    if not 1 <= options.port <= 65535:
        raise ValueError(f"port must be in 1-65535, got {options.port}")
    if options.served_model_name is not None:
        check_text("served model name", options.served_model_name)
    if options.api_key_env is not None:
        check_env_name("api_key_env", options.api_key_env)
    check_env_name("hf_token_env", options.hf_token_env)
    if options.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {options.dtype!r}")
    if options.speculative_method is not None:
        if options.speculative_method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative method must be one of {', '.join(SPECULATIVE_METHODS)}, "
                f"got {options.speculative_method!r}"
            )
        if options.speculative_method != "ngram" and not options.speculative_model:
            raise ValueError(f"speculative method {options.speculative_method} needs a speculative model")
        if not 1 <= options.num_speculative_tokens <= 16:
            raise ValueError(f"num_speculative_tokens must be in 1-16, got {options.num_speculative_tokens}")
    if options.speculative_model is not None:
        check_model("speculative model", options.speculative_model)
    if options.gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be at least 1, got {options.gpus_per_node}")


def check_revision(revision: str | None) -> str | None:
    if revision is not None and not REVISION.match(revision):
        raise ValueError(
            f"revision must be a branch, tag or commit (letters, digits, . _ / -), got {revision!r}"
        )
    return revision


# --- rendering -----------------------------------------------------------------------------------------


def shell_token(token: Token) -> str:
    """One argument, quoted for bash; an EnvRef expands at run time and stops the script when unset."""
    if isinstance(token, EnvRef):
        return f'"${{{token.name}:?set {token.name} first}}"'
    if isinstance(token, Raw):
        return token.text
    return shlex.quote(token)


def shell_command(argv: list[Token], indent: str = "  ") -> str:
    """A multi-line bash command: the program and positional words first, then one flag (and value) a line."""
    lines: list[list[str]] = [[]]
    flag_line = False  # the current line holds a flag: it takes at most one value
    for token in argv:
        is_flag = isinstance(token, str) and token.startswith("-")
        if lines[-1] and (is_flag or (flag_line and len(lines[-1]) >= 2)):
            lines.append([])
            flag_line = False
        flag_line = flag_line or is_flag
        lines[-1].append(shell_token(token))
    return f" \\\n{indent}".join(" ".join(words) for words in lines)


def shell_script(commands: list[str], comment: str) -> str:
    header = "".join(f"# {line}\n" if line else "#\n" for line in comment.splitlines())
    return "#!/usr/bin/env bash\n" + header + "set -euo pipefail\n\n" + "\n\n".join(commands) + "\n"


def compose_token(token: Token) -> str:
    """A value in a compose file: ``$`` doubled so compose does not interpolate it; EnvRef interpolates."""
    if isinstance(token, EnvRef):
        return f"${{{token.name}:?set {token.name} first}}"
    text = token.text if isinstance(token, Raw) else token
    return text.replace("$", "$$")


def k8s_token(token: Token) -> str:
    """A container arg in Kubernetes: ``$(VAR)`` is expanded from the container env, ``$$`` escapes it."""
    if isinstance(token, EnvRef):
        return f"$({token.name})"
    text = token.text if isinstance(token, Raw) else token
    return text.replace("$(", "$$(")


def env_names(argv: list[Token]) -> list[str]:
    return [token.name for token in argv if isinstance(token, EnvRef)]


@dataclass(slots=True)
class Skipped:
    """A file set that was not generated, and why."""

    engine: str
    format: str
    reason: str


class _Dumper(yaml.SafeDumper):
    """Plain YAML for people: no anchors/aliases, multi-line strings as literal blocks."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def dump_yaml(doc: object) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)


def dump_yaml_all(docs: list) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)
