"""Sliding-window layers and the KV they keep (no torch: the planner imports this).

A layer with window W attends, from position p, to keys p - W + 1 .. p (transformers' sliding_window_overlay),
so a sequence's blocks wholly before p - W + 1 are never read again by it. This engine's KV pool holds every
layer's K and V in one block (one block table a sequence), so it frees such blocks only when every layer is
windowed (vLLM's SlidingWindowManager.remove_skipped_blocks; freeable_window); a hybrid model (Gemma 2/3,
gpt-oss: full layers among windowed ones) keeps every block for its full layers, while its windowed layers
read at most blocks_read(W) of them. vLLM's hybrid allocator gives each layer type its own blocks: its bytes
per sequence are kv_cache_bytes' per_sequence, this engine's are engine_per_sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NULL_BLOCK = -1  # a block table's entry for a block freed before the window (vLLM's null_block)
# layer_types as transformers' configuration classes build them when config.json has none: every
# pattern-th layer full, the others windowed (configuration_gemma2.py, configuration_gemma3.py,
# configuration_cohere2.py, configuration_gpt_oss.py in transformers 5.24)
DEFAULT_PATTERNS = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4, "gpt_oss": 2}


def _reader(config: Mapping[str, Any] | Any):
    """config.get for a config.json dict, getattr for a transformers config (a multimodal one's text part)."""
    if isinstance(config, Mapping):
        config = config.get("text_config") or config
        return lambda key, default=None: config.get(key, default)
    config = getattr(config, "text_config", None) or config
    return lambda key, default=None: getattr(config, key, default)


def layer_windows(config: Mapping[str, Any] | Any) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: full attention), from a config.json dict or a transformers config:
    layer_types where given, else sliding_window_pattern (or the model type's default pattern), else Qwen2's
    use_sliding_window and max_window_layers, else sliding_window on every layer (Mistral, Phi-3)."""
    get = _reader(config)
    num_layers, window = int(get("num_hidden_layers")), get("sliding_window")
    if not window or get("use_sliding_window", True) is False:
        return (None,) * num_layers
    window = int(window)
    types = get("layer_types")
    if types:
        if len(types) != num_layers:
            raise ValueError(f"layer_types has {len(types)} entries for {num_layers} layers")
        return tuple(window if kind == "sliding_attention" else None for kind in types)
    pattern = get("sliding_window_pattern") or DEFAULT_PATTERNS.get(get("model_type", ""))
    if pattern:
        return tuple(None if (i + 1) % int(pattern) == 0 else window for i in range(num_layers))
    first = int(get("max_window_layers", 0) or 0) if get("use_sliding_window") else 0  # Qwen2's
    return tuple(window if i >= first else None for i in range(num_layers))


def freeable_window(windows: tuple[int | None, ...]) -> int | None:
    """The window after which this engine frees a sequence's blocks: the largest, when every layer has one."""
    if not windows or any(window is None for window in windows):
        return None
    return max(w for w in windows if w is not None)


def blocks_read(window: int, block_size: int) -> int:
    """The most blocks a query reads under a window of window keys: they span window - 1 keys back."""
    return -(-(window - 1) // block_size) + 1


def blocks_per_sequence(
    windows: tuple[int | None, ...], block_size: int, max_len: int, max_num_batched_tokens: int
) -> int:
    """The most blocks one sequence of up to max_len tokens holds at a time in this engine: all of them,
    or where every layer is windowed, its window's and one step's chunk's (and one more, for a window that
    starts mid-block), the blocks before them freed (the KV pool's sizing, here and in the planner)."""
    full, window = -(-max_len // block_size), freeable_window(windows)
    if window is None:
        return full
    return min(full, blocks_read(window, block_size) + -(-max_num_batched_tokens // block_size) + 1)


def first_needed_block(num_computed_tokens: int, window: int, block_size: int) -> int:
    """The first block the next token (at position num_computed_tokens) reads: the ones before are skipped."""
    return max(0, num_computed_tokens - window + 1) // block_size


def blocks_held(seq_len: int, window: int | None, block_size: int) -> int:
    """Blocks a layer with window (None: full) holds for a sequence of seq_len tokens decoding its last."""
    total = -(-seq_len // block_size)
    if window is None:
        return total
    return total - first_needed_block(seq_len - 1, window, block_size)


@dataclass(slots=True, frozen=True)
class KVCacheBytes:
    """KV bytes of one sequence of seq_len tokens (its last being decoded), in whole blocks."""

    per_token_full: int  # bytes per token of the full-attention layers: what grows with the length
    per_sequence: int  # every layer holding only its window's blocks (vLLM's hybrid allocator)
    engine_per_sequence: int  # this engine: one block table for all layers (freeable_window)


def kv_cache_bytes(
    windows: tuple[int | None, ...],  # layer_windows
    layer_bytes_per_token: int,  # 2 * num_kv_heads * head_dim * kv element bytes, one layer
    seq_len: int,
    block_size: int,
) -> KVCacheBytes:
    block_bytes = block_size * layer_bytes_per_token
    full = sum(window is None for window in windows)
    per_sequence = sum(blocks_held(seq_len, window, block_size) for window in windows) * block_bytes
    engine = blocks_held(seq_len, freeable_window(windows), block_size) * len(windows) * block_bytes
    return KVCacheBytes(full * layer_bytes_per_token, per_sequence, engine)


def describe(windows: tuple[int | None, ...], block_size: int) -> str:
    """What the KV pool keeps, for the engine's start log and stats(): e.g. "sliding window 512 on 5 of 6
    layers: those layers read at most 33 blocks per sequence; every block is kept for the full layer"."""
    windowed = sorted({w for w in windows if w is not None})
    if not windowed:
        return "full attention on every layer: every block of a sequence is kept"
    sizes = " and ".join(str(w) for w in windowed)
    count = sum(w is not None for w in windows)
    most = blocks_read(windowed[-1], block_size)
    text = f"sliding window {sizes} on {count} of {len(windows)} layers: those layers read at most {most}"
    text += " blocks per sequence"
    if freeable_window(windows) is not None:
        return f"{text}; blocks before the window are freed"
    full = len(windows) - count
    return f"{text}; every block is kept for the {full} full-attention layer{'s' if full > 1 else ''}"
