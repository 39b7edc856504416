"""QualityConfig: every knob of a quality run, defined once; `app.py quality`'s flags derive from its
fields (help, choices, minimum, repeatable), as the server's do from EngineConfig."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from backend.engine.config import DTYPES, KV_CACHE_DTYPES
from backend.errors import UserError

# The default run (docs/quality.md): the packaged Q4_1 GGUF as stored, with fp8 KV, and its dequantized
# weights with fp8 KV, each against the dequantized weights with KV in dtype.
DEFAULT_REFERENCE = "default@dequantized"
DEFAULT_MODELS = ("default", "default@dequantized,kv=fp8", "default@kv=fp8")
# Bounds on a run's work: llama.cpp's usual n_ctx is 512; a longer context scores the same text in
# fewer, costlier chunks
MAX_CTX = 8192
MAX_MODELS = 8


def option(default: Any, help: str, **metadata: Any) -> Any:
    return field(default=default, metadata={"help": help} | metadata)


@dataclass(slots=True)
class QualityConfig:
    model: tuple[str, ...] | None = option(
        None,
        "a model to score, MODEL[@OPTION,...]: a folder, .gguf or `default`; options `dequantized`, "
        "`kv=fp8`, any engine field NAME=VALUE (repeat --model for several)",
        repeat=True,
    )
    reference: str | None = option(None, "the reference, a model spec as --model (e.g. default@dequantized)")
    ctx: int = option(512, "tokens per chunk (llama.cpp's -c); the second half of each is scored", minimum=8)
    chunks: int | None = option(None, "score at most this many chunks (llama.cpp's --chunks)", minimum=1)
    text: str | None = option(None, "a UTF-8 text file to score instead of the shipped text")
    dtype: str | None = option(
        None, "weights and activations of every model unless its spec sets one", choices=DTYPES
    )
    kv_cache_dtype: str | None = option(
        None,
        "KV cache of every --model unless its spec sets kv= (not the reference)",
        choices=KV_CACHE_DTYPES,
    )
    out: str | None = option(None, "write the report as JSON to this file")

    def __post_init__(self) -> None:
        if self.model is not None:
            self.model = tuple(self.model)  # argparse's append gives a list
        if self.model is not None and len(self.model) > MAX_MODELS:
            raise UserError(f"at most {MAX_MODELS} --model values, got {len(self.model)}")
        if not 8 <= self.ctx <= MAX_CTX:
            raise UserError(f"ctx must be in [8, {MAX_CTX}], got {self.ctx}")
        if self.chunks is not None and self.chunks < 1:
            raise UserError(f"chunks must be >= 1, got {self.chunks}")
        if (self.model is None) != (self.reference is None):
            raise UserError(
                "give --model and --reference together, or neither (the default run: "
                f"{', '.join(DEFAULT_MODELS)} against {DEFAULT_REFERENCE})"
            )

    @property
    def model_specs(self) -> list[str]:
        return list(self.model) if self.model else list(DEFAULT_MODELS)

    @property
    def reference_spec(self) -> str:
        return self.reference or DEFAULT_REFERENCE

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for f in fields(QualityConfig):
            meta = f.metadata
            default = None if f.default is MISSING else f.default
            kwargs: dict[str, Any] = {"default": default, "help": meta["help"]}
            if meta.get("repeat"):
                kwargs["action"] = "append"
            elif f.type in ("int", "int | None"):
                kwargs["type"] = int
            if meta.get("choices"):
                kwargs["choices"] = meta["choices"]
            if default is not None:
                kwargs["help"] += f" (default: {default})"
            parser.add_argument("--" + f.name.replace("_", "-"), **kwargs)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> QualityConfig:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})
