"""Untrusted model descriptions, bounded before anything is read into memory or allocated from them.

A Hub repository a visitor names, or a GGUF file, is data from strangers: a 10 GB config.json, a layer
count of 10^12 or a GGUF string "of 2^63 bytes" must be a clear error, not a hang or an out-of-memory
kill. One function per source, called where each is read:

- ``read_config_json(path)``: a config.json, refused above MAX_CONFIG_BYTES before it is read;
- ``check_config(config)``: the integer fields of a config dict (and its text_config) in range;
- ``check_gguf_header(path)``: a GGUF file's counts and lengths against the file and our limits, walked
  without reading any tensor, before gguf's GGUFReader or transformers parse it;
- ``check_gguf_metadata(fields)``: the same integer fields, named as GGUF metadata keys.

New fields (experts, windows, ...) are one line in CONFIG_RANGES or GGUF_KEYS.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from backend.errors import UserError

# The largest config.json we know is a few tens of kB (quantization configs listing modules); 2 MiB
# leaves room and still bounds what is read.
MAX_CONFIG_BYTES = 2 * 1024 * 1024
# Allowed ranges, each well above the largest published model: 126 layers and hidden 16,384 (Llama 3.1
# 405B), 128 heads (DeepSeek-V3), vocabulary 262,144 (Gemma 3), 384 experts (Kimi K2), context
# 10,485,760 (Llama 4 Scout).
CONFIG_RANGES: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 1024),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "hidden_size": (1, 1 << 16),
    "intermediate_size": (1, 1 << 18),
    "moe_intermediate_size": (1, 1 << 18),
    "head_dim": (1, 4096),
    "vocab_size": (1, 1 << 21),
    "max_position_embeddings": (1, 1 << 24),
    "sliding_window": (1, 1 << 24),
    "num_local_experts": (1, 4096),
    "num_experts": (1, 4096),
    "n_routed_experts": (1, 4096),
    "num_experts_per_tok": (1, 256),
}
# GGUF metadata key (after "<architecture>.") -> the config field it becomes (llama.cpp's names)
GGUF_KEYS = {
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.key_length": "head_dim",
    "attention.value_length": "head_dim",
    "vocab_size": "vocab_size",
    "context_length": "max_position_embeddings",
    "attention.sliding_window": "sliding_window",
    "expert_count": "num_local_experts",
    "expert_used_count": "num_experts_per_tok",
}
# GGUF file structure (github.com/ggml-org/ggml, docs/gguf.md): value type -> size of a fixed-size value
GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
GGUF_STRING, GGUF_ARRAY = 8, 9
MAX_GGUF_TENSORS = (
    1 << 20
)  # a 405B model has ~1,100 tensors; MoE files with split experts far fewer than this
MAX_GGUF_KEYS = 1 << 16  # llama.cpp's files hold a few dozen keys
MAX_GGUF_ARRAY = 1 << 24  # the largest vocabularies have 262,144 entries (merges a few more)


class UntrustedModelError(UserError):
    """A model description outside what any real model has; the message names the field and the range."""


def read_config_json(path: str | Path, limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A config.json as a dict, refused before reading when it is larger than ``limit`` bytes."""
    path = Path(path)
    size = path.stat().st_size
    if size > limit:
        raise UntrustedModelError(
            f"{path.name} is {size:,} bytes; a model config may be at most {limit:,} bytes (MAX_CONFIG_BYTES)"
        )
    with path.open("rb") as file:
        data = json.loads(file.read(limit + 1))
    if not isinstance(data, dict):
        raise UntrustedModelError(f"{path.name} must hold a JSON object, got {type(data).__name__}")
    return data


def check_config(config: Mapping[str, Any], where: str = "config") -> None:
    """Every known integer field of ``config`` (and of its ``text_config``) within CONFIG_RANGES."""
    for name, (low, high) in CONFIG_RANGES.items():
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise UntrustedModelError(
                f"{where}.{name} = {str(value)[:40]} is outside what any model has: expected a whole "
                f"number in {low:,}..{high:,}"
            )
    text_config = config.get("text_config")
    if isinstance(text_config, Mapping):
        check_config(text_config, f"{where}.text_config")


def check_gguf_metadata(fields: Mapping[str, Any]) -> None:
    """The integer GGUF keys of ``fields`` ({key: value}, e.g. "llama.block_count": 30) in range."""
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        return
    config = {GGUF_KEYS[key[len(arch) + 1 :]]: value for key, value in fields.items()
              if key.startswith(arch + ".") and key[len(arch) + 1 :] in GGUF_KEYS}  # fmt: skip
    check_config(config, f"GGUF metadata ({arch})")


def check_gguf_header(path: str | Path) -> None:
    """Walk a GGUF file's header and metadata (no tensor data) and refuse counts or lengths that exceed
    the file or our limits, before a parser allocates anything from them."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as file:
        magic, _version, num_tensors, num_keys = _unpack(file, "<4sIQQ", path)
        if magic != b"GGUF":
            raise UntrustedModelError(f"{path.name} is not a GGUF file (magic {magic!r})")
        _bounded(num_tensors, MAX_GGUF_TENSORS, "tensor count", path)
        _bounded(num_keys, MAX_GGUF_KEYS, "metadata key count", path)
        for _ in range(num_keys):
            _skip_string(file, size, path)
            (value_type,) = _unpack(file, "<I", path)
            _skip_value(file, value_type, size, path, depth=0)


def _unpack(file: BinaryIO, layout: str, path: Path) -> tuple:
    data = file.read(struct.calcsize(layout))
    if len(data) < struct.calcsize(layout):
        raise UntrustedModelError(f"{path.name} ends inside its GGUF header (truncated file)")
    return struct.unpack(layout, data)


def _bounded(count: int, limit: int, what: str, path: Path) -> None:
    if count > limit:
        raise UntrustedModelError(f"{path.name}: GGUF {what} {count:,} exceeds the limit of {limit:,}")


def _skip(file: BinaryIO, length: int, size: int, what: str, path: Path) -> None:
    if length > size - file.tell():
        raise UntrustedModelError(
            f"{path.name}: a GGUF {what} of {length:,} bytes runs past the end of the file"
        )
    file.seek(length, 1)


def _skip_string(file: BinaryIO, size: int, path: Path) -> None:
    (length,) = _unpack(file, "<Q", path)
    _skip(file, length, size, "string", path)


def _skip_value(file: BinaryIO, value_type: int, size: int, path: Path, depth: int) -> None:
    if value_type in GGUF_SCALAR_SIZES:
        _skip(file, GGUF_SCALAR_SIZES[value_type], size, "value", path)
    elif value_type == GGUF_STRING:
        _skip_string(file, size, path)
    elif value_type == GGUF_ARRAY and depth == 0:  # llama.cpp writes no nested arrays; refuse deeper ones
        item_type, count = _unpack(file, "<IQ", path)
        _bounded(count, MAX_GGUF_ARRAY, "array length", path)
        if item_type in GGUF_SCALAR_SIZES:
            _skip(file, count * GGUF_SCALAR_SIZES[item_type], size, "array", path)
        else:
            for _ in range(count):
                _skip_value(file, item_type, size, path, depth + 1)
    else:
        raise UntrustedModelError(f"{path.name}: unknown or nested GGUF value type {value_type}")
