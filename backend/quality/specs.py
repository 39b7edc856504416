"""ModelSpec: one model to score, with the engine options it runs under, from a string the CLI and the
forms take: `MODEL[@OPTION[,OPTION...]]`.

MODEL is a local folder, a .gguf file, a Hub id, or `default` (the packaged default model). OPTIONs:
`dequantized` (dequantize_weights=True: the checkpoint expanded to dtype at load, the usual reference),
`kv=fp8` (kv_cache_dtype), or any EngineConfig field as `name=value` (dtype=float32, block_size=32, ...).
Examples: `default@dequantized`, `default@kv=fp8`, `./my-gptq@dtype=bfloat16`. A path that itself contains
"@" is taken whole when it exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from backend.engine.config import EngineConfig, cli_types
from backend.errors import UserError

DEFAULT = "default"
ALIASES = {"kv": "kv_cache_dtype"}  # short names of EngineConfig fields
FLAGS = {"dequantized": ("dequantize_weights", True)}  # options without a value
# EngineConfig fields a spec cannot set: the model is the spec's own; speculative decoding adds nothing
# to prompt logprobs
FIXED = ("model", "speculative_config")


@dataclass(slots=True)
class ModelSpec:
    label: str  # the spec as given, shown in the table
    model: str  # what LLM(model) loads
    options: dict[str, Any] = field(default_factory=dict)  # EngineConfig fields the spec sets

    def engine_kwargs(self, n_ctx: int, defaults: dict[str, Any]) -> dict[str, Any]:
        """LLM(model, **kwargs): the spec's options over the run's defaults, sized for one chunk: one
        sequence of n_ctx + 1 tokens (the prompt and the one token generate() samples), no decode graph."""
        kwargs = {"enforce_eager": True, "max_num_seqs": 1} | defaults | self.options
        block_size = kwargs.get("block_size", 16)
        kwargs.setdefault("max_model_len", n_ctx + 1)
        kwargs.setdefault("num_kv_blocks", math.ceil((n_ctx + 1) / block_size) + 1)
        return kwargs


def parse_spec(text: str, default_model: str | None = None) -> ModelSpec:
    """A ModelSpec from `MODEL[@OPTION,...]`; UserError saying what is allowed."""
    text = text.strip()
    if not text:
        raise UserError("a model spec is empty: give MODEL[@OPTION,...], e.g. default@kv=fp8")
    if "@" not in text or Path(text).expanduser().exists():
        model, tail = text, ""
    else:
        model, _, tail = text.rpartition("@")
    if not model:
        raise UserError(f"model spec {text!r} names no model before '@'")
    options: dict[str, Any] = {}
    for option in filter(None, (part.strip() for part in tail.split(","))):
        name, value = parse_option(option, text)
        options[name] = value
    EngineConfig.from_kwargs("spec-check", **options)  # each value checked as the engine checks it
    resolved = resolve_model(model, default_model)
    return ModelSpec(text, resolved, options)


def parse_option(option: str, spec: str) -> tuple[str, Any]:
    """(EngineConfig field, value) of one `name=value` or flag option."""
    if option in FLAGS:
        return FLAGS[option]
    name, equals, raw = option.partition("=")
    name = ALIASES.get(name.strip(), name.strip())
    allowed = [f.name for f in fields(EngineConfig) if f.name not in FIXED]
    if not equals or name not in allowed:
        raise UserError(
            f"model spec {spec!r}: unknown option {option!r}; options are {', '.join(FLAGS)}, kv=DTYPE "
            f"or NAME=VALUE with NAME one of {', '.join(allowed)}"
        )
    return name, convert(name, raw.strip(), spec)


def convert(name: str, raw: str, spec: str) -> Any:
    kind = cli_types()[name]
    if kind is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise UserError(f"model spec {spec!r}: {name} takes true or false, got {raw!r}")
        return raw.lower() in ("true", "1")
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise UserError(f"model spec {spec!r}: {name} takes an integer, got {raw!r}") from None
    return raw


def resolve_model(model: str, default_model: str | None) -> str:
    if model != DEFAULT:
        return model
    if default_model is None:
        from backend.default_model import default_model as find_default

        return find_default(check_hub=False)
    return default_model
