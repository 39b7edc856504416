"""Paged attention in pure PyTorch: write the step's K/V into the block pool, read it back per block table.

Decodes (one query token each) are batched into one scaled_dot_product_attention over their gathered,
padded KV; each prefill chunk attends to its cached prefix plus itself with a causal mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class PrefillChunk:
    start: int  # first row of this chunk in the step's packed tokens
    end: int
    num_cached: int  # tokens already in the cache before this chunk
    block_table: torch.Tensor  # [num_blocks_needed] block ids covering num_cached + (end - start)


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] flat slot in the pool for each token's K/V
    num_decodes: int  # the first num_decodes tokens are decodes, one per sequence
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks], padded with block 0
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_blocks * block_size], True = attend
    prefills: list[PrefillChunk]


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    b = meta.num_decodes
    if b:
        keys = k_cache[meta.decode_block_tables].view(b, -1, num_kv_heads, head_dim).transpose(1, 2)
        values = v_cache[meta.decode_block_tables].view(b, -1, num_kv_heads, head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q[:b].unsqueeze(2), keys, values, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True
        )
        out[:b] = o.squeeze(2)
    for chunk in meta.prefills:
        query = q[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        n = chunk.end - chunk.start
        if chunk.num_cached == 0:  # the whole context is in this chunk: plain causal attention
            keys = k[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
            values = v[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                query, keys, values, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            total = chunk.num_cached + n
            keys = k_cache[chunk.block_table].view(-1, num_kv_heads, head_dim)[:total]
            values = v_cache[chunk.block_table].view(-1, num_kv_heads, head_dim)[:total]
            rows = torch.arange(chunk.num_cached, total, device=q.device)[:, None]
            mask = torch.arange(total, device=q.device)[None, :] <= rows
            o = F.scaled_dot_product_attention(
                query,
                keys.transpose(0, 1).unsqueeze(0),
                values.transpose(0, 1).unsqueeze(0),
                attn_mask=mask,
                scale=scale,
                enable_gqa=True,
            )
        out[chunk.start : chunk.end] = o[0].transpose(0, 1)
    return out
