"""Paged attention: write the step's K/V into the block pool, read it back per block table.

The pool of one layer is [num_kv_heads, num_blocks, block_size, head_dim]. On the CPU, decodes go to a
native kernel (cpu_kernels.py) that reads the pool in place through the block tables: no gather, no
padding to the longest context, no fp32 copy; all prefill chunks of the step go to another in one call
(varlen, causal, cached prefixes read in place). Elsewhere (CUDA, or no compiler) the PyTorch paths of
attention_torch.py gather the blocks and run scaled_dot_product_attention per step and chunk.
An fp8 pool (kv_cache_dtype="fp8") stores k / k_scale and v / v_scale, clamped to the type's range and
rounded to nearest even, and every reader multiplies the scale back (vLLM's per-layer k_scale / v_scale,
1.0 unless a checkpoint gives them); the PyTorch paths upcast what they gather, the kernels read fp8.

A layer may add a sliding window, a logit soft-cap and attention sinks, with transformers' semantics
(csrc/attention_features.h). The kernels never read keys before a window, so a windowed layer's cost
follows its window and a sequence's blocks there may have been freed (NULL_BLOCK in its table); the
PyTorch paths gather those as block 0 and mask them. rope_and_cache rotates the first rotary_dim elements
of each head (Phi-3's partial rotary; 0 for a NoPE layer) with the tables the layer passes.
"""

from __future__ import annotations

import torch

from backend.engine import cpu_kernels
from backend.engine.attention_metadata import AttentionMetadata as AttentionMetadata  # re-exported
from backend.engine.attention_metadata import PrefillChunk as PrefillChunk
from backend.engine.attention_torch import AttentionParams, decode_gathered, prefill_chunk, to_cache
from backend.engine.attention_torch import from_cache as from_cache  # re-exported: runner, tests, bench
from backend.engine.attention_torch import gather_blocks as gather_blocks
from backend.engine.attention_torch import pool_rows as pool_rows


def write_kv_cache(
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [KVH, num_blocks, block_size, D]
    v_cache: torch.Tensor,
    slots: torch.Tensor,  # [T] slot_mapping
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> None:
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    for x, cache, scale in ((k, k_cache, kv_scales[0]), (v, v_cache, kv_scales[1])):
        stored = to_cache(x, cache, scale)
        pool = cache.view(stored.dtype).view(num_kv_heads, -1, head_dim)
        pool.index_copy_(1, slots, stored.transpose(0, 1))


def rope_and_cache(
    qkv: torch.Tensor,  # [T, (H + 2 * KVH) * D]: q and k rotated in place
    positions: torch.Tensor,  # [T] int64
    cos: torch.Tensor | None,  # [max_positions, rotary_dim] (None with rotary_dim 0)
    sin: torch.Tensor | None,
    slot_mapping: torch.Tensor,  # [T] int64
    k_cache: torch.Tensor,  # [KVH, num_blocks, block_size, D]: k and v written at slot_mapping
    v_cache: torch.Tensor,
    num_heads: int,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    rotary_dim: int | None = None,  # the first rotary_dim of each head rotate (None: all; 0: none, NoPE)
) -> None:
    """cpu_kernels.rope_and_cache in PyTorch, the same arithmetic: transformers' q * cos + rotate_half(q) *
    sin on the first rotary_dim elements of each q and k head (Phi-3's partial rotary), the rest passed."""
    kv_heads, head_dim = k_cache.shape[0], k_cache.shape[3]
    heads = qkv.view(qkv.shape[0], -1, head_dim)
    width = cpu_kernels.rotary_width(rotary_dim, head_dim, cos)
    if width:
        assert sin is not None and cos is not None
        x = heads[:, : num_heads + kv_heads, :width]
        half = width // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        x.copy_(x * cos[positions, None] + rotated * sin[positions, None])
    k, v = heads[:, num_heads : num_heads + kv_heads], heads[:, num_heads + kv_heads :]
    write_kv_cache(k, v, k_cache, v_cache, slot_mapping, kv_scales)


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, KVH, D], already in the cache
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [KVH, num_blocks, block_size, D]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    kv_scales: tuple[float, float] = (1.0, 1.0),  # an fp8 pool's (k_scale, v_scale)
    *,
    sliding_window: int | None = None,  # a query at p sees keys p - W + 1 .. p (None: all up to p)
    soft_cap: float | None = None,  # Gemma 2: scaled scores -> cap * tanh(scores / cap)
    sinks: torch.Tensor | None = None,  # [H] gpt-oss: per-head logits in the softmax's denominator only
) -> torch.Tensor:
    """Each token's attention over its sequence's keys in the pool: transformers' eager attention with the
    layer's window, soft-cap and sinks. Keep sinks as a [H] fp32 tensor (another dtype is converted per
    call)."""
    check_features(sliding_window, soft_cap, sinks, q.shape[1])
    if sinks is not None and (sinks.dtype != torch.float32 or not sinks.is_contiguous()):
        sinks = sinks.float().contiguous()
    out = q.new_empty(q.shape)  # contiguous, also when q is a view into a fused q/k tensor
    b = meta.num_decodes
    if b and meta.decode_block_tables is not None:
        tables, lens = meta.decode_block_tables, meta.decode_context_lens
        assert lens is not None, "the runner sets block tables and context lengths together"
        cpu_kernels.paged_decode_attention(
            q[:b], k_cache, v_cache, tables, lens, scale, out, kv_scales,
            sliding_window=sliding_window, soft_cap=soft_cap, sinks=sinks,
        )  # fmt: skip
    if meta.prefill_kernel is not None:
        cpu_kernels.paged_prefill_attention(
            q, k_cache, v_cache, meta.prefill_kernel, scale, out, kv_scales,
            sliding_window=sliding_window, soft_cap=soft_cap, sinks=sinks,
        )  # fmt: skip
    if (b and meta.decode_block_tables is None) or meta.prefills:
        params = AttentionParams(scale, kv_scales, sliding_window, soft_cap, sinks)
        if b and meta.decode_block_tables is None:
            decode_gathered(q[:b], (k_cache, v_cache), meta, params, out[:b])
        for index in range(len(meta.prefills)):
            prefill_chunk((q, k, v), (k_cache, v_cache), meta, index, params, out)
    return out


def check_features(
    sliding_window: int | None, soft_cap: float | None, sinks: torch.Tensor | None, num_heads: int
) -> None:
    """A layer's window, cap and sinks as its model's config gives them (ValueError: what is allowed)."""
    if sliding_window is not None and (not isinstance(sliding_window, int) or sliding_window < 1):
        raise ValueError(
            f"sliding_window must be a whole number of tokens >= 1 (or None), got {sliding_window!r}"
        )
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"soft_cap must be > 0 (or None for no capping), got {soft_cap!r}")
    if sinks is not None and tuple(sinks.shape) != (num_heads,):
        raise ValueError(
            f"sinks must hold one logit per query head ({num_heads}), got shape {tuple(sinks.shape)}"
        )
