"""The PyTorch paths of paged attention (attention.py dispatches; CUDA takes them, and the CPU where the
native kernels are not built): blocks gathered from the pool, padded and masked, then one
scaled_dot_product_attention, or transformers' eager softmax where a soft-cap or sinks rule SDPA out.

A sliding window's masks are built by the step's first layer with that window and kept in
meta.window_masks for the others. Blocks a sequence has freed before its window (NULL_BLOCK in its table)
are gathered as block 0 and masked out; a prefill chunk gathers from its first query's window start only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from backend.engine.attention_metadata import AttentionMetadata

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(slots=True)
class AttentionParams:
    """How one layer scores and weighs its keys (paged_attention's arguments)."""

    scale: float
    kv_scales: tuple[float, float]  # an fp8 pool's (k_scale, v_scale)
    sliding_window: int | None
    soft_cap: float | None
    sinks: torch.Tensor | None  # [H] fp32


def pool_rows(block_ids: list[int], num_kv_heads: int, num_blocks: int, device: torch.device) -> torch.Tensor:
    """Rows of the pool viewed as [KVH * num_blocks, block_size * D] holding block_ids, head by head (a
    freed block before a sliding window, NULL_BLOCK, reads block 0: masked out)."""
    ids = torch.tensor(block_ids, device=device).clamp_(min=0)
    return (torch.arange(num_kv_heads, device=device)[:, None] * num_blocks + ids[None, :]).flatten()


def gather_blocks(cache: torch.Tensor, rows: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """cache [KVH, num_blocks, block_size, D] -> [KVH, blocks * block_size, D] (rows from pool_rows)."""
    kv_heads, num_blocks, block_size, head_dim = cache.shape
    out = buffer[: rows.numel() * block_size * head_dim].view(rows.numel(), block_size * head_dim)
    torch.index_select(cache.view(kv_heads * num_blocks, -1), 0, rows, out=out)
    return out.view(kv_heads, -1, head_dim)


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


def decode_gathered(
    q: torch.Tensor,  # [b, H, D]: the decode rows
    kv_cache: tuple[torch.Tensor, torch.Tensor],  # [KVH, num_blocks, block_size, D] each
    meta: AttentionMetadata,
    params: AttentionParams,
    out: torch.Tensor,  # [b, H, D]
) -> None:
    """The decode rows: every block of each table gathered, padded and masked, in fp32 (far closer to an
    fp32 reference than bf16 flash attention, for a small extra cost); the query heads of a GQA group are
    the query rows of their KV head (no KV repeat)."""
    assert meta.gather_buffers is not None and meta.decode_rows is not None, "set by prepare_decode"
    (b, num_heads, head_dim), num_kv_heads = q.shape, kv_cache[0].shape[0]
    shape = (num_kv_heads, b, -1, head_dim)
    keys, values = (
        from_cache(
            gather_blocks(cache, meta.decode_rows, buffer).view(shape).transpose(0, 1), scale, torch.float32
        )
        for cache, buffer, scale in zip(kv_cache, meta.gather_buffers, params.kv_scales, strict=True)
    )
    query = q.view(b, num_kv_heads, num_heads // num_kv_heads, head_dim).float()
    mask = decode_window_mask(meta, params.sliding_window)
    if params.soft_cap is None and params.sinks is None:
        o = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=params.scale)
    else:  # [b, KVH, G, 1, D] against [b, KVH, 1, K, D]
        o = eager_attention(
            query[..., None, :], keys[:, :, None], values[:, :, None], mask[..., None, :], params
        )
    out.copy_(o.reshape(b, num_heads, head_dim))


def decode_window_mask(meta: AttentionMetadata, window: int | None) -> torch.Tensor:
    """meta.decode_mask [b, 1, 1, K], with a window only each row's last window keys (a row's context
    length is its mask's count)."""
    assert meta.decode_mask is not None, "set by prepare_decode"
    key = ("decode", window or 0)
    if window is not None and key not in meta.window_masks:
        lens = meta.decode_mask.sum(-1, keepdim=True)
        positions = torch.arange(meta.decode_mask.shape[-1], device=lens.device)
        meta.window_masks[key] = meta.decode_mask & (positions > lens - 1 - window)
    return meta.decode_mask if window is None else meta.window_masks[key]


def prefill_chunk(
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],  # q [T, H, D], k and v [T, KVH, D]
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    index: int,  # of the chunk in meta.prefills
    params: AttentionParams,
    out: torch.Tensor,  # [T, H, D]: the chunk's rows written
) -> None:
    """One prefill chunk: causal over its own keys (a first chunk) or over its gathered blocks (a later
    one; with a window, from the first key its first query sees: window_keys_start)."""
    (q, k, v), chunk = qkv, meta.prefills[index]
    query = q[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
    if chunk.mask is None:  # the whole context is in this chunk
        keys = k[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
        values = v[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
    else:
        assert meta.gather_buffers is not None and chunk.block_rows is not None, "set by prepare_prefill"
        first, total = window_keys_start(chunk.num_cached, params.sliding_window), chunk.mask.shape[1]
        keys, values = (
            from_cache(
                gather_blocks(cache, chunk.block_rows, buffer)[:, first:total].unsqueeze(0), scale, q.dtype
            )
            for cache, buffer, scale in zip(kv_cache, meta.gather_buffers, params.kv_scales, strict=True)
        )
    mask = prefill_window_mask(meta, index, params.sliding_window)
    if params.soft_cap is None and params.sinks is None:
        o = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=mask, is_causal=mask is None, scale=params.scale, enable_gqa=True
        )
    else:
        n, num_kv_heads = chunk.end - chunk.start, keys.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril() if mask is None else mask
        grouped = query.float().view(1, num_kv_heads, -1, n, query.shape[-1])  # [1, KVH, G, n, D]
        o = eager_attention(grouped, keys.float()[:, :, None], values.float()[:, :, None], causal, params)
        o = o.view(query.shape).to(q.dtype)
    out[chunk.start : chunk.end] = o[0].transpose(0, 1)


def window_keys_start(num_cached: int, window: int | None) -> int:
    """The first key a chunk whose first query is at position num_cached sees (0 without a window)."""
    return 0 if window is None else max(0, num_cached - window + 1)


def prefill_window_mask(meta: AttentionMetadata, index: int, window: int | None) -> torch.Tensor | None:
    """The chunk's mask (None: plain causal over its own keys); with a window, [n, keys from
    window_keys_start] causal and within the window."""
    chunk = meta.prefills[index]
    if window is None:
        return chunk.mask
    key = (index, window)
    if key not in meta.window_masks:
        first, n = window_keys_start(chunk.num_cached, window), chunk.end - chunk.start
        device = meta.positions.device
        query_pos = torch.arange(chunk.num_cached, chunk.num_cached + n, device=device)[:, None]
        key_pos = torch.arange(first, chunk.num_cached + n, device=device)[None, :]
        meta.window_masks[key] = (key_pos <= query_pos) & (key_pos > query_pos - window)
    return meta.window_masks[key]


def eager_attention(
    query: torch.Tensor,  # [B, KVH, G, L, D] fp32
    keys: torch.Tensor,  # [B, KVH, 1, S, D] fp32
    values: torch.Tensor,
    mask: torch.Tensor,  # bool, broadcastable to [B, KVH, G, L, S], True = attend
    params: AttentionParams,
) -> torch.Tensor:
    """transformers' eager attention with Gemma 2's soft-cap and gpt-oss's sinks (its eager_attention_forward
    of each), in fp32: [B, KVH, G, L, D]."""
    scores = query @ keys.transpose(-1, -2) * params.scale
    if params.soft_cap is not None:
        scores = torch.tanh(scores / params.soft_cap) * params.soft_cap
    scores = scores.masked_fill(~mask, float("-inf"))
    if params.sinks is None:
        return scores.softmax(-1) @ values
    num_kv_heads, group = query.shape[1], query.shape[2]
    sink = params.sinks.view(1, num_kv_heads, group, 1, 1).expand(*scores.shape[:-1], 1)
    combined = torch.cat((scores, sink), dim=-1)
    probs = (combined - combined.amax(-1, keepdim=True)).softmax(-1)[..., :-1]
    return probs @ values
