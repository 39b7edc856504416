"""Helpers for the attention kernel tests (no tests here): a step's prefill chunks and decode rows over a
random, shuffled KV pool, and the fp64 references they are checked against (plain causal SDPA, and
transformers' definitions of sliding windows, soft-caps and sinks)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from backend.engine.attention import from_cache, to_cache
from backend.engine.cpu_kernels import PrefillKernelInputs

# (new tokens, cached prefix) per chunk: no prefix, one-token chunks, prefixes ending mid-block, a chunk
# longer than the kernel's key tile of 64 and query tile, lengths around block boundaries
CHUNKS = ((70, 0), (1, 0), (5, 35), (33, 67), (130, 170), (17, 0), (1, 40))


@dataclass
class PrefillCase:
    q: torch.Tensor  # [T, H, D], a view into fused qkv rows (token stride (H + 2 * KVH) * D)
    k_cache: torch.Tensor  # [KVH, num_blocks, block_size, D]
    v_cache: torch.Tensor
    inputs: PrefillKernelInputs
    kv_scales: tuple[float, float]

    @property
    def scale(self) -> float:
        return self.q.shape[-1] ** -0.5

    @property
    def rows(self) -> tuple[int, int]:
        """The first and past-the-last rows of the chunks (rows outside are decode rows, not written)."""
        starts = self.inputs.query_start_loc
        return int(starts[0]), int(starts[-1])


def prefill_case(
    dtype: torch.dtype,
    shape: tuple[int, int, int],  # (num_heads, num_kv_heads, head_dim)
    block_size: int,
    chunks: tuple[tuple[int, int], ...] = CHUNKS,
    kv_dtype: torch.dtype | None = None,  # an fp8 pool, with k_scale 0.5 and v_scale 2.0
    seed: int = 0,
) -> PrefillCase:
    heads, kv_heads, head_dim = shape
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-(n + cached) // block_size) for n, cached in chunks) + 3
    pool_shape = (kv_heads, num_blocks, block_size, head_dim)
    keys, values = torch.randn(pool_shape, generator=gen), torch.randn(pool_shape, generator=gen)
    kv_scales = (1.0, 1.0) if kv_dtype is None else (0.5, 2.0)
    caches = []
    for x, scale in zip((keys, values), kv_scales, strict=True):
        cache = torch.empty(pool_shape, dtype=kv_dtype or dtype)
        cache.view(torch.uint8 if kv_dtype else dtype).copy_(to_cache(x.to(dtype), cache, scale))
        caches.append(cache)
    free = torch.randperm(num_blocks, generator=gen).tolist()  # each sequence's blocks scattered
    max_blocks = max(-(-(n + cached) // block_size) for n, cached in chunks)
    starts, seq_lens, tables = [3], [], []  # rows 0-2: decode rows, left alone
    for n, cached in chunks:
        starts.append(starts[-1] + n)
        seq_lens.append(n + cached)
        table = [free.pop() for _ in range(-(-(n + cached) // block_size))]
        tables.append(table + [0] * (max_blocks - len(table)))
    qkv = torch.randn(starts[-1] + 2, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    inputs = PrefillKernelInputs(torch.tensor(starts), torch.tensor(seq_lens), torch.tensor(tables))
    return PrefillCase(qkv[:, :heads], caches[0], caches[1], inputs, kv_scales)


def reference_prefill(case: PrefillCase, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Each chunk's causal SDPA over its gathered cached prefix and its own keys ([rows, H, D] in dtype;
    float64: the reference, bfloat16: what torch's bf16 attention computes)."""
    kv_heads, _, block_size, head_dim = case.k_cache.shape
    starts, outs = case.inputs.query_start_loc.tolist(), []
    for i, length in enumerate(case.inputs.seq_lens.tolist()):
        n = starts[i + 1] - starts[i]
        blocks = case.inputs.block_tables[i, : -(-length // block_size)]
        gathered = []
        for cache, scale in zip((case.k_cache, case.v_cache), case.kv_scales, strict=True):
            x = cache[:, blocks].reshape(kv_heads, -1, head_dim)[:, :length]
            gathered.append(from_cache(x, scale, dtype))  # fp8 values times 0.5 or 2: exact in any float
        query = case.q[starts[i] : starts[i + 1]].to(dtype).transpose(0, 1)[None]
        mask = torch.arange(length)[None, :] <= torch.arange(length - n, length)[:, None]
        o = F.scaled_dot_product_attention(
            query, gathered[0][None], gathered[1][None], attn_mask=mask, scale=case.scale, enable_gqa=True
        )
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


@dataclass(frozen=True)
class Features:
    """A layer's attention options as paged_attention takes them (the reference's too)."""

    sliding_window: int | None = None
    soft_cap: float | None = None
    sinks: torch.Tensor | None = None  # [H] fp32

    def kwargs(self) -> dict:
        return {"sliding_window": self.sliding_window, "soft_cap": self.soft_cap, "sinks": self.sinks}


def reference_attention(
    query: torch.Tensor,  # [L, H, D]
    keys: torch.Tensor,  # [KVH, S, D]: positions 0 .. S - 1
    values: torch.Tensor,
    positions: list[int],  # [L]: each query's position
    scale: float,
    features: Features,
) -> torch.Tensor:
    """[L, H, D] in fp64, written from transformers' definitions: the mask and_masks(causal, kv > q - W)
    (masking_utils.sliding_window_overlay), Gemma 2's tanh(scores / cap) * cap on the scaled scores, and
    gpt-oss's sinks concatenated to the scores before the softmax, then dropped."""
    heads, kv_heads = query.shape[1], keys.shape[0]
    q = query.double().transpose(0, 1)  # [H, L, D]
    k = keys.double().repeat_interleave(heads // kv_heads, 0)
    v = values.double().repeat_interleave(heads // kv_heads, 0)
    scores = q @ k.transpose(1, 2) * scale  # [H, L, S]
    if features.soft_cap is not None:
        scores = torch.tanh(scores / features.soft_cap) * features.soft_cap
    q_idx, kv_idx = torch.tensor(positions)[:, None], torch.arange(keys.shape[1])[None, :]
    mask = kv_idx <= q_idx
    if features.sliding_window is not None:
        mask &= kv_idx > q_idx - features.sliding_window
    scores = scores.masked_fill(~mask, float("-inf"))
    if features.sinks is not None:
        sinks = features.sinks.double()[:, None, None].expand(heads, len(positions), 1)
        probs = torch.cat((scores, sinks), dim=-1).softmax(-1)[..., :-1]
    else:
        probs = scores.softmax(-1)
    return (probs @ v).transpose(0, 1)


def with_poisoned_blocks(
    k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor, first_keys: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k_cache, v_cache, tables) with one more block, all NaN, in place of each row's blocks wholly before
    its first_keys[row] (the blocks a sliding window lets the engine free): a kernel that reads one of
    them writes NaN."""
    block_size = k_cache.shape[2]
    caches = []
    for cache in (k_cache, v_cache):
        poison = torch.full_like(cache[:, :1], float("nan"), dtype=torch.float32).to(cache.dtype)
        caches.append(torch.cat((cache, poison), dim=1))
    tables = tables.clone()
    for row, first in enumerate(first_keys):
        tables[row, : first // block_size] = k_cache.shape[1]
    return caches[0], caches[1], tables


def decode_inputs(dtype, shape, seed=0, kv_dtype=None):
    """(q, k_cache, v_cache, tables, lens, kv_scales): contexts around block and tile boundaries, each
    sequence's blocks shuffled through the pool."""
    heads, kv_heads, head_dim = shape
    gen = torch.Generator().manual_seed(seed)
    num_blocks, block_size = 60, 16
    lens = torch.tensor([1, 7, 15, 16, 17, 33, 100, 150])
    max_blocks = -(-int(lens.max()) // block_size)
    pool = (kv_heads, num_blocks, block_size, head_dim)
    kv_scales = (1.0, 1.0) if kv_dtype is None else (0.5, 2.0)
    caches = [(torch.randn(pool, generator=gen) / scale).to(kv_dtype or dtype) for scale in kv_scales]
    tables = torch.stack([torch.randperm(num_blocks, generator=gen)[:max_blocks] for _ in lens])
    q = torch.randn(len(lens), heads, head_dim, generator=gen).to(dtype)
    return q, caches[0], caches[1], tables, lens, kv_scales


def reference_decode(q, k_cache, v_cache, tables, lens, kv_scales, features) -> torch.Tensor:
    kv_heads, _, block_size, head_dim = k_cache.shape
    outs = []
    for t, n in enumerate(lens.tolist()):
        blocks = tables[t, : -(-n // block_size)]
        keys = k_cache[:, blocks].double().reshape(kv_heads, -1, head_dim)[:, :n] * kv_scales[0]
        values = v_cache[:, blocks].double().reshape(kv_heads, -1, head_dim)[:, :n] * kv_scales[1]
        outs.append(reference_attention(q[t : t + 1], keys, values, [n - 1], head_dim**-0.5, features)[0])
    return torch.stack(outs)


def reference_prefill_features(case, features: Features) -> torch.Tensor:
    """Each chunk's rows: its queries at the last positions of its sequence against all its keys."""
    kv_heads, _, block_size, head_dim = case.k_cache.shape
    starts, outs = case.inputs.query_start_loc.tolist(), []
    for i, length in enumerate(case.inputs.seq_lens.tolist()):
        n = starts[i + 1] - starts[i]
        blocks = case.inputs.block_tables[i, : -(-length // block_size)]
        keys, values = (
            cache[:, blocks].double().reshape(kv_heads, -1, head_dim)[:, :length] * scale
            for cache, scale in zip((case.k_cache, case.v_cache), case.kv_scales, strict=True)
        )
        query = case.q[starts[i] : starts[i + 1]]
        outs.append(
            reference_attention(query, keys, values, list(range(length - n, length)), case.scale, features)
        )
    return torch.cat(outs)
