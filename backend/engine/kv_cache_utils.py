"""How many KV blocks the pool gets and the context length it supports (vLLM's kv_cache_utils).

The default budget (a share of free memory) gives up the captured decode step's buffers first, as vLLM's
profiler takes its CUDA graphs' memory off the KV cache: the graph is allocated after the pool (it holds
the pool's addresses), so its bytes are counted from the model's widths (decode_graph_memory.py).
A model whose every layer has a sliding window needs, per sequence, only the blocks its window and one
step's chunk span (the rest are freed: sliding_window.py), not a whole max_model_len's."""

from __future__ import annotations

from typing import Any

import torch

from backend.engine import cpu_kernels, sliding_window
from backend.engine.config import EngineConfig
from backend.engine.decode_graph_memory import DecodeGraphShape, decode_graph_bytes
from backend.engine.decode_graph_support import graph_shape, unsupported_reason
from backend.engine.device import kv_cache_budget_bytes
from backend.engine.model_runner import ModelRunner
from backend.engine.models.base import CausalLM


def decode_graph_shape(model: CausalLM, config: EngineConfig) -> DecodeGraphShape | None:
    """The widths of the decode graph the engine will capture (None: enforce_eager, or a model that
    cannot be captured: decode_graph_support.unsupported_reason)."""
    weight = model.norm.weight
    if config.enforce_eager or unsupported_reason(model, cpu_kernels.supports(weight.device, weight.dtype)):
        return None
    return graph_shape(model)


def size_kv_pool(
    config: EngineConfig, hf_config: Any, model: CausalLM, device: torch.device
) -> tuple[int, int]:
    """(number of KV blocks, max_model_len): the pool always holds at least one max-length sequence."""
    bs = config.block_size
    model_limit = getattr(hf_config, "max_position_embeddings", None) or 2048
    if config.max_model_len is not None and config.max_model_len > model_limit:
        raise ValueError(
            f"max_model_len={config.max_model_len} exceeds the model's limit of {model_limit} tokens"
        )
    max_len = config.max_model_len or model_limit
    per_block = ModelRunner.bytes_per_block(model, bs, config.kv_cache_dtype)
    if config.num_kv_blocks is not None:
        num_blocks = config.num_kv_blocks
    elif config.kv_cache_memory_bytes is not None:
        num_blocks = config.kv_cache_memory_bytes // per_block
    else:
        graph = decode_graph_shape(model, config)
        graph_bytes = decode_graph_bytes(graph, config.max_num_seqs, max_len, bs) if graph else 0
        enough = config.max_num_seqs * blocks_per_sequence(model, config, max_len)
        num_blocks = min(enough, (kv_cache_budget_bytes(device) - graph_bytes) // per_block)
    if num_blocks < 1:
        raise ValueError(f"the KV pool must hold at least one block of {per_block} bytes")
    if num_blocks < blocks_per_sequence(model, config, max_len):
        if config.max_model_len is not None:
            raise ValueError(
                f"max_model_len={max_len} needs {blocks_per_sequence(model, config, max_len)} KV blocks "
                f"of {bs} tokens, but the KV pool has only {num_blocks}; lower max_model_len or give the "
                "pool more memory"
            )
        max_len = num_blocks * bs
    return num_blocks, max_len


def blocks_per_sequence(model: CausalLM, config: EngineConfig, max_len: int) -> int:
    """sliding_window.blocks_per_sequence for the windows the model's layers declare."""
    return sliding_window.blocks_per_sequence(
        model.sliding_windows, config.block_size, max_len, config.max_num_batched_tokens
    )
