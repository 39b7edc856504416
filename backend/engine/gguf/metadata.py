"""A GGUF file's metadata, read once and in one place, with every number the engine sizes memory or loops
by range-checked before anything uses it.

transformers' reader (integrations.gguf.read_gguf_metadata) walks the key-value section and the tensor
table without touching tensor data and without decoding the vocabulary's strings (a string array is kept
as its length); numeric arrays are read whole. A file cut short or holding a value of an unknown type fails
here with a ValueError that names the file, never deeper in the loader.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from backend.model_limits import check_gguf_header

# Upper bounds on what a real model states; a file outside them is refused before anything is allocated.
# The largest published models stay far below each: Llama-3.1-405B has 126 layers, 128 heads, hidden 16384
# and a 53248-wide MLP; Gemma 3 a 262144-token vocabulary and 512-wide heads (Gemma 4); Kimi K2 384 experts;
# Llama 4 Scout a 10M-token context.
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HIDDEN = 1 << 17
MAX_FFN = 1 << 20
MAX_HEAD_DIM = 1024
MAX_CONTEXT = 1 << 25
MAX_VOCAB = 1 << 21
MAX_EXPERTS = 1 << 12


@dataclass(slots=True)
class GGUFMetadata:
    """The metadata of one file; keys under the architecture's prefix are read with `arch_key`."""

    path: str
    architecture: str  # general.architecture, as llama.cpp spells it ("gemma3", "gpt-oss", ...)
    fields: dict[str, Any]  # key -> value; a string array (tokens, merges) is its length
    tensor_names: tuple[str, ...]

    def arch_key(self, name: str) -> str:
        return f"{self.architecture}.{name}"

    def has(self, name: str) -> bool:
        return self.arch_key(name) in self.fields

    def count(self, name: str, low: int, high: int, default: int | None = None) -> int:
        """An integer under the architecture's prefix, required to lie in [low, high]."""
        key = self.arch_key(name)
        value = self.fields.get(key, default)
        if value is None:
            raise ValueError(
                f"{self.path}: the GGUF metadata has no {key!r}, which a {self.architecture} needs"
            )
        return checked_int(self.path, key, value, low, high)

    def counts(self, name: str, low: int, high: int, length: int) -> list[int] | None:
        """A per-layer integer array (or None when absent); a single value is refused by the caller."""
        key = self.arch_key(name)
        value = self.fields.get(key)
        if not isinstance(value, list):
            return None
        if len(value) != length:
            raise ValueError(
                f"{self.path}: {key} has {len(value)} entries, expected one per layer ({length})"
            )
        return [checked_int(self.path, key, item, low, high) for item in value]

    def number(self, name: str, default: float | None = None, positive: bool = True) -> float | None:
        """A finite float under the architecture's prefix (positive unless told otherwise), or default."""
        key = self.arch_key(name)
        value = self.fields.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{self.path}: {key} must be a finite number, got {value!r}")
        if positive and value <= 0:
            raise ValueError(f"{self.path}: {key} must be positive, got {value!r}")
        return as_written(float(value))

    def text(self, key: str) -> str | None:
        """A string at a full key (tokenizer.chat_template, general.name, rope.scaling.type, ...)."""
        value = self.fields.get(key)
        return value if isinstance(value, str) else None

    def token_id(self, name: str, vocab_size: int) -> int | None:
        """tokenizer.ggml.<name>_token_id, when present, inside the vocabulary."""
        key = f"tokenizer.ggml.{name}_token_id"
        value = self.fields.get(key)
        return None if value is None else checked_int(self.path, key, value, 0, vocab_size - 1)


def as_written(value: float) -> float:
    """A float32 field as the decimal it was written from (1e-05, not 9.999999747378752e-06): the shortest
    decimal that rounds to the same float32; values a float32 cannot hold (float64 fields) are kept."""
    single = np.float32(value)
    return float(str(single)) if float(single) == value else value


def checked_int(path: str, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{path}: {key} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{path}: {key} = {value} is outside the range a model can have ({low}..{high})")
    return value


def read_metadata(path: str) -> GGUFMetadata:
    """The file's metadata and tensor names (no tensor data, no vocabulary strings)."""
    from transformers.integrations.gguf import read_gguf_metadata

    check_gguf_header(path)  # counts and lengths bounded (model_limits) before the reader allocates
    try:
        fields, names = read_gguf_metadata(path)
    except (struct.error, UnicodeDecodeError, IndexError, OverflowError, MemoryError) as exc:
        raise ValueError(f"{path} is not a readable GGUF file (cut short or corrupt: {exc})") from exc
    architecture = fields.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise ValueError(f"{path}: general.architecture must be a non-empty string, got {architecture!r}")
    return GGUFMetadata(path, architecture, fields, names)
