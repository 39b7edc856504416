"""AttentionMetadata: where a step's tokens go in the KV pool and what each attends to, built once per step
by the runner (model_runner.py) and read by every layer's paged_attention (attention.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from backend.engine.cpu_kernels import PrefillKernelInputs


@dataclass(slots=True)
class PrefillChunk:
    start: int  # first row of this chunk in the step's packed tokens
    end: int
    num_cached: int  # tokens already in the cache before this chunk
    block_rows: torch.Tensor | None  # pool_rows of the blocks covering num_cached + (end - start)
    mask: torch.Tensor | None  # [n, num_cached + n], True = attend; None when num_cached == 0


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] flat slot in the pool for each token's K/V
    positions: torch.Tensor  # [num_tokens] int64 position of each token in its sequence
    num_decodes: int  # the first num_decodes tokens are decode rows (a sequence's token, then its drafts)
    decode_rows: torch.Tensor | None  # pool_rows of the block tables, each padded to max_blocks with block 0
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_blocks * block_size], True = attend
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks] for the CPU kernel, else None
    decode_context_lens: torch.Tensor | None  # [num_decodes]
    prefills: list[PrefillChunk]
    prefill_kernel: PrefillKernelInputs | None  # the chunks for the CPU kernel (then prefills is empty)
    gather_buffers: tuple[torch.Tensor, torch.Tensor] | None  # flat scratch for gathered K and V
    # the PyTorch paths' masks for a sliding window, built by the step's first layer with that window:
    # ("decode", W) -> like decode_mask; (chunk index, W) -> [n, keys from window_keys_start]
    window_masks: dict[tuple[object, int], torch.Tensor] = field(default_factory=dict)
