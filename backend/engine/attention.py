"""Paged attention in pure PyTorch: write the step's K/V into the block pool, read it back per block table.

The pool of one layer is [num_kv_heads, num_blocks, block_size, head_dim], so gathering a block table
gives each KV head's keys as one contiguous [tokens, head_dim] matrix. Decodes (one query token each) are
batched into one fp32 scaled_dot_product_attention over their gathered, padded KV, with the query heads
of a GQA group as the query rows of their KV head (no KV repeat); each prefill chunk attends to its cached
prefix plus itself with a causal mask. Masks and gather buffers are built once per step, for all layers.
On the CPU, decodes go instead to a native kernel (cpu_kernels.py) that reads the pool in place through
the block tables: no gather, no padding to the longest context, no fp32 copy (several times faster); and
all prefill chunks of the step go to another in one call (varlen, causal, cached prefixes read in place).
An fp8 pool (kv_cache_dtype="fp8") stores k / k_scale and v / v_scale, clamped to the type's range and
rounded to nearest even, and every reader multiplies the scale back (vLLM's per-layer k_scale / v_scale,
1.0 unless a checkpoint gives them); the PyTorch paths upcast what they gather, the kernel reads fp8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from backend.engine import cpu_kernels
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


def pool_rows(block_ids: list[int], num_kv_heads: int, num_blocks: int, device: torch.device) -> torch.Tensor:
    """Rows of the pool viewed as [KVH * num_blocks, block_size * D] holding block_ids, head by head."""
    ids = torch.tensor(block_ids, device=device)
    return (torch.arange(num_kv_heads, device=device)[:, None] * num_blocks + ids[None, :]).flatten()


def gather_blocks(cache: torch.Tensor, rows: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """cache [KVH, num_blocks, block_size, D] -> [KVH, blocks * block_size, D] (rows from pool_rows)."""
    kv_heads, num_blocks, block_size, head_dim = cache.shape
    out = buffer[: rows.numel() * block_size * head_dim].view(rows.numel(), block_size * head_dim)
    torch.index_select(cache.view(kv_heads * num_blocks, -1), 0, rows, out=out)
    return out.view(kv_heads, -1, head_dim)


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def to_cache(x: torch.Tensor, cache: torch.Tensor, scale: float) -> torch.Tensor:
    """x as the pool stores it: itself, or x / scale in fp8 (as bytes: index_copy_ has no fp8 kernel)."""
    if cache.dtype not in FP8_DTYPES:
        return x
    limit = torch.finfo(cache.dtype).max
    return (x.float() / scale).clamp(-limit, limit).to(cache.dtype).view(torch.uint8)


def from_cache(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Values read from the pool in dtype (an fp8 pool's upcast and scaled)."""
    if x.dtype not in FP8_DTYPES:
        return x.to(dtype)
    return (x.float() * scale).to(dtype)


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


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, KVH, D], already in the cache
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [KVH, num_blocks, block_size, D]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    kv_scales: tuple[float, float] = (1.0, 1.0),  # an fp8 pool's (k_scale, v_scale)
) -> torch.Tensor:
    num_heads, num_kv_heads, head_dim = q.shape[1], k.shape[1], k.shape[2]
    out = q.new_empty(q.shape)  # contiguous, also when q is a view into a fused q/k tensor
    b = meta.num_decodes
    if b and meta.decode_block_tables is not None:
        tables, lens = meta.decode_block_tables, meta.decode_context_lens
        assert lens is not None, "the runner sets block tables and context lengths together"
        cpu_kernels.paged_decode_attention(q[:b], k_cache, v_cache, tables, lens, scale, out, kv_scales)
    elif b:
        assert meta.gather_buffers is not None and meta.decode_rows is not None, "set by prepare_decode"
        k_buffer, v_buffer = meta.gather_buffers
        shape = (num_kv_heads, b, -1, head_dim)
        keys = gather_blocks(k_cache, meta.decode_rows, k_buffer).view(shape).transpose(0, 1)
        values = gather_blocks(v_cache, meta.decode_rows, v_buffer).view(shape).transpose(0, 1)
        # in fp32: far closer to an fp32 reference than bf16 flash attention, for a small extra cost
        query = q[:b].view(b, num_kv_heads, num_heads // num_kv_heads, head_dim).float()
        keys, values = (
            from_cache(keys, kv_scales[0], torch.float32),
            from_cache(values, kv_scales[1], torch.float32),
        )
        o = F.scaled_dot_product_attention(query, keys, values, attn_mask=meta.decode_mask, scale=scale)
        out[:b] = o.reshape(b, num_heads, head_dim)
    if meta.prefill_kernel is not None:
        cpu_kernels.paged_prefill_attention(q, k_cache, v_cache, meta.prefill_kernel, scale, out, kv_scales)
    for chunk in meta.prefills:
        query = q[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        if chunk.mask is None:  # the whole context is in this chunk: plain causal attention
            keys = k[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
            values = v[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
        else:
            assert meta.gather_buffers is not None and chunk.block_rows is not None, "set by prepare_prefill"
            k_buffer, v_buffer = meta.gather_buffers
            total = chunk.mask.shape[1]
            keys = gather_blocks(k_cache, chunk.block_rows, k_buffer)[:, :total].unsqueeze(0)
            values = gather_blocks(v_cache, chunk.block_rows, v_buffer)[:, :total].unsqueeze(0)
            keys, values = from_cache(keys, kv_scales[0], q.dtype), from_cache(values, kv_scales[1], q.dtype)
        o = F.scaled_dot_product_attention(
            query,
            keys,
            values,
            attn_mask=chunk.mask,
            is_causal=chunk.mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[chunk.start : chunk.end] = o[0].transpose(0, 1)
    return out
