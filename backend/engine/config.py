"""EngineConfig: every knob of the embedded engine, defined once, with vLLM's names.

Everything else derives from these fields and their metadata (`knob`, backend/knobs.py: help, choices,
minimum): the server CLI (`add_cli_args` / `from_cli_args`, like vLLM's `EngineArgs`), `LLM(model,
**kwargs)` (`from_kwargs`, like nano-vllm's `Config` filter), the UI's Launch form and the embedded
exporter (`cli_args`).
tests/engine/test_engine_config.py checks that every field reaches each of them.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from backend.engine.spec_decode.config import SpeculativeConfig, canonical_json
from backend.errors import UserError
from backend.knobs import knob, scalar_types

DTYPES = ("auto", "bfloat16", "float16", "float32")
DEVICES = ("auto", "cpu", "cuda")  # and "cuda:N"
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's CacheDType (fp8 = fp8_e4m3)


@dataclass(slots=True)
class EngineConfig:
    model: str = field(metadata={"help": "Hub id, local folder or .gguf file"})
    dtype: str = knob("auto", "weights and activations; auto = bf16 where the device is fast at it", DTYPES)
    device: str = knob("auto", "auto, cpu, cuda or cuda:N; auto = a CUDA GPU if there is one", DEVICES)
    block_size: int = knob(16, "tokens per KV-cache block", minimum=1)
    max_num_seqs: int = knob(64, "most requests scheduled in one step", minimum=1)
    max_num_batched_tokens: int = knob(
        512, "token budget of one step (long prompts prefill in chunks)", minimum=1
    )
    max_model_len: int | None = knob(
        None, "context length; unset = the model's (capped by the KV pool)", minimum=1
    )
    num_kv_blocks: int | None = knob(
        None, "KV-cache blocks; unset = sized from kv_cache_memory_bytes", minimum=1
    )
    kv_cache_memory_bytes: int | None = knob(
        None, "memory for the KV cache; unset = a share of free memory", minimum=1
    )
    kv_cache_dtype: str = knob(
        "auto", "KV-cache storage; auto = dtype, fp8 (= fp8_e4m3) holds twice the tokens", KV_CACHE_DTYPES
    )
    enable_prefix_caching: bool = knob(True, "reuse the KV blocks of shared prompt prefixes")
    seed: int = knob(0, "engine random seed", minimum=0)
    trust_remote_code: bool = knob(False, "run Python code shipped with the model")
    dequantize_weights: bool = knob(
        False, "expand a quantized checkpoint (GGUF) to dtype at load instead of running it as stored"
    )
    enforce_eager: bool = knob(
        False,
        "run every step through the model's modules; off = decode-only steps on the CPU replay the "
        "captured native kernel calls (vLLM's CUDA graphs) where the model supports it",
    )
    speculative_config: str | None = knob(
        None,
        "speculative decoding, vLLM's JSON: "
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4} or '
        '{"method": "draft_model", "model": PATH, "num_speculative_tokens": 4}; unset = off',
    )

    def __post_init__(self) -> None:
        if isinstance(self.speculative_config, dict):  # LLM(speculative_config={...}), like vLLM
            self.speculative_config = canonical_json(self.speculative_config)
        for f in fields(self):
            check_value(f, getattr(self, f.name))
        if self.speculative_config is not None:
            self.speculative_config = canonical_json(self.speculative_config)

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineConfig:
        """`LLM(model, **kwargs)`: a ValueError names unknown arguments and the allowed ones."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise UserError(
                f"unknown engine argument(s) {', '.join(unknown)}; allowed: {', '.join(names[1:])}"
            )
        return cls(model=str(model), **kwargs)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        """One `--flag-name` per field (`--no-flag` for booleans), defaults and help from the fields."""
        hints = cli_types()
        for f in fields(EngineConfig):
            help_text = f.metadata["help"]
            default = None if f.default is MISSING else f.default
            if default is not None:
                help_text += f" (default: {default})"
            flag = "--" + f.name.replace("_", "-")
            if hints[f.name] is bool:
                parser.add_argument(
                    flag, action=argparse.BooleanOptionalAction, default=default, help=help_text
                )
            else:
                choices = (
                    f.metadata.get("choices") if f.name != "device" else None
                )  # device also takes cuda:N
                parser.add_argument(
                    flag, type=hints[f.name], default=default, choices=choices, help=help_text
                )

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineConfig:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def explicit_items(self) -> list[tuple[str, Any]]:
        """(name, value) of every field that is set (None means "automatic" and is left out)."""
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]

    def cli_args(self) -> list[str]:
        """The flags that `from_cli_args` turns back into this config (the embedded exporter writes them)."""
        argv: list[str] = []
        for name, value in self.explicit_items():
            flag = name.replace("_", "-")
            if isinstance(value, bool):
                argv.append(f"--{flag}" if value else f"--no-{flag}")
            else:
                argv += [f"--{flag}", str(value)]
        return argv


def cli_types() -> dict[str, type]:
    """The scalar type of each field (`int | None` -> int)."""
    return scalar_types(EngineConfig)


def check_value(f: Field, value: Any) -> None:
    """ValueError saying what is wrong with one field's value and what is allowed."""
    kind = cli_types()[f.name]
    optional = f.default is None
    if value is None and optional:
        return
    if kind is int:
        minimum = f.metadata["minimum"]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            prefix = "None or " if optional else ""
            raise UserError(f"{f.name} must be {prefix}an integer >= {minimum}, got {value!r}")
    elif kind is bool:
        if not isinstance(value, bool):
            raise UserError(f"{f.name} must be True or False, got {value!r}")
    elif not isinstance(value, str):
        raise UserError(f"{f.name} must be a string, got {value!r}")
    choices = f.metadata.get("choices")
    if choices and value not in choices and not (f.name == "device" and value.startswith("cuda:")):
        raise UserError(f"{f.name} must be one of {', '.join(choices)}; got {value!r}")


def config_field(name: str) -> Field:
    return next(f for f in fields(EngineConfig) if f.name == name)


def speculative_model(config: EngineConfig) -> str | None:
    """The draft model a config would load (None without one)."""
    if config.speculative_config is None:
        return None
    return SpeculativeConfig.parse(config.speculative_config).model
