"""Sliding windows, logit soft-caps and attention sinks in paged attention: the native decode and prefill
kernels and the PyTorch paths (decode gather, prefill chunks) against an fp64 reference written from
transformers' definitions (tests/attention_utils.py reference_attention). Blocks wholly before a window are
poisoned with NaN for the kernels: a kernel that reads one (instead of skipping it) writes NaN."""

from __future__ import annotations

import pytest
import torch

from backend.engine import cpu_kernels
from backend.engine.attention import AttentionMetadata, PrefillChunk, paged_attention, pool_rows
from backend.engine.cpu_kernels import PrefillKernelInputs
from tests.attention_utils import (
    Features,
    decode_inputs,
    prefill_case,
    reference_decode,
    reference_prefill_features,
    with_poisoned_blocks,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
has_kernels = pytest.mark.skipif(
    not cpu_kernels.supports(torch.device("cpu"), torch.float32), reason="no C++ compiler"
)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # bf16: the probabilities and the output rounded
SINKS = torch.tensor([0.5, -1.0, 2.0, 0.0, 3.0, -2.0, 1.0, 0.25, -0.5])  # up to 9 heads
# windows of 1 key, smaller than a block and not a multiple of it, a block, past a tile of 64, larger
# than every context; each alone, with a soft-cap, with sinks, and all together
FEATURES = {
    "window 1": Features(sliding_window=1),
    "window 7": Features(sliding_window=7),
    "window 16": Features(sliding_window=16),
    "window 65 capped": Features(sliding_window=65, soft_cap=2.0),
    "window 1000 with sinks": Features(sliding_window=1000, sinks=SINKS),
    "soft cap": Features(soft_cap=2.0),
    "sinks": Features(sinks=SINKS),
    "window 20 capped with sinks": Features(sliding_window=20, soft_cap=5.0, sinks=SINKS),
}


def for_heads(features: Features, heads: int) -> Features:
    sinks = None if features.sinks is None else features.sinks[:heads].contiguous()
    return Features(features.sliding_window, features.soft_cap, sinks)


def first_keys(positions: list[int], window: int | None) -> list[int]:
    return [0 if window is None else max(0, p - window + 1) for p in positions]


@has_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 2, 16), (9, 3, 64), (8, 1, 32)])  # (H, KVH, D): GQA 2, 3, 8
@pytest.mark.parametrize("name", list(FEATURES))
def test_decode_kernel_matches_the_reference_without_reading_outside_the_window(dtype, shape, name):
    features = for_heads(FEATURES[name], shape[0])
    q, k_cache, v_cache, tables, lens, kv_scales = decode_inputs(dtype, shape)
    expected = reference_decode(q, k_cache, v_cache, tables, lens, kv_scales, features)
    k_cache, v_cache, tables = with_poisoned_blocks(
        k_cache, v_cache, tables, first_keys([n - 1 for n in lens.tolist()], features.sliding_window)
    )
    out = torch.full_like(q, float("nan"))
    cpu_kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, q.shape[-1] ** -0.5, out, **features.kwargs()
    )
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


@has_kernels
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernel_features_on_an_fp8_pool(dtype, kv_dtype):
    features = for_heads(FEATURES["window 20 capped with sinks"], 9)
    q, k_cache, v_cache, tables, lens, kv_scales = decode_inputs(dtype, (9, 3, 64), kv_dtype=kv_dtype)
    expected = reference_decode(q, k_cache, v_cache, tables, lens, kv_scales, features)
    out = torch.full_like(q, float("nan"))
    scale = q.shape[-1] ** -0.5
    cpu_kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, lens, scale, out, kv_scales, **features.kwargs()
    )
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


def chunk_first_keys(case, window: int | None) -> list[int]:
    starts, lens = case.inputs.query_start_loc.tolist(), case.inputs.seq_lens.tolist()
    return first_keys([length - (starts[i + 1] - starts[i]) for i, length in enumerate(lens)], window)


@has_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("shape", "block_size"), [((9, 3, 64), 16), ((4, 2, 16), 5), ((8, 1, 32), 32)])
@pytest.mark.parametrize("name", list(FEATURES))
def test_prefill_kernel_matches_the_reference_without_reading_outside_the_window(
    dtype, shape, block_size, name
):
    """Chunks with and without cached prefixes (tests/attention_utils.py CHUNKS), longer than a key tile."""
    features = for_heads(FEATURES[name], shape[0])
    case = prefill_case(dtype, shape, block_size)
    expected = reference_prefill_features(case, features)
    k_cache, v_cache, tables = with_poisoned_blocks(
        case.k_cache, case.v_cache, case.inputs.block_tables, chunk_first_keys(case, features.sliding_window)
    )
    inputs = PrefillKernelInputs(case.inputs.query_start_loc, case.inputs.seq_lens, tables)
    out = torch.full(case.q.shape, float("nan"), dtype=dtype)
    cpu_kernels.paged_prefill_attention(
        case.q, k_cache, v_cache, inputs, case.scale, out, **features.kwargs()
    )
    first, end = case.rows
    assert out[:first].isnan().all() and out[end:].isnan().all()  # decode rows and the rest untouched
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out[first:end].double(), expected, atol=tol, rtol=tol)


@has_kernels
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_kernel_features_on_an_fp8_pool(dtype, kv_dtype):
    features = for_heads(FEATURES["window 20 capped with sinks"], 9)
    case = prefill_case(dtype, (9, 3, 64), 16, kv_dtype=kv_dtype)
    out = torch.full(case.q.shape, float("nan"), dtype=dtype)
    cpu_kernels.paged_prefill_attention(
        case.q, case.k_cache, case.v_cache, case.inputs, case.scale, out, case.kv_scales, **features.kwargs()
    )
    first, end = case.rows
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(
        out[first:end].double(), reference_prefill_features(case, features), atol=tol, rtol=tol
    )


@has_kernels
@pytest.mark.parametrize("threads", [1, 3])
def test_prefill_kernel_windows_on_several_threads(threads):
    """Work items skip the tiles before their windows: any thread count still covers every row once."""
    case = prefill_case(
        torch.float32, (9, 3, 64), 16, chunks=((300, 0), (64, 200), (3, 0), (130, 70)), seed=2
    )
    features = Features(sliding_window=50, sinks=SINKS)
    out = torch.full(case.q.shape, float("nan"))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cpu_kernels.paged_prefill_attention(
            case.q, case.k_cache, case.v_cache, case.inputs, case.scale, out, **features.kwargs()
        )
    finally:
        torch.set_num_threads(previous)
    first, end = case.rows
    torch.testing.assert_close(
        out[first:end].double(), reference_prefill_features(case, features), atol=1e-5, rtol=1e-5
    )


def torch_metadata(case, decode=None) -> AttentionMetadata:
    """The step as ModelRunner builds it for the PyTorch paths (prepare_decode / prepare_prefill): decode
    rows (q rows 0 .. b - 1) with padded tables and a length mask, then the case's chunks, each after a
    cached prefix gathering its blocks (NULL_BLOCK entries gathered as block 0) with a causal mask."""
    kv_heads, num_blocks, block_size, head_dim = case.k_cache.shape
    starts, lens = case.inputs.query_start_loc.tolist(), case.inputs.seq_lens.tolist()
    chunks, most = [], 0
    for i, length in enumerate(lens):
        cached = length - (starts[i + 1] - starts[i])
        if not cached:
            chunks.append(PrefillChunk(starts[i], starts[i + 1], 0, None, None))
            continue
        used = case.inputs.block_tables[i, : -(-length // block_size)].tolist()
        mask = torch.arange(length)[None, :] <= torch.arange(cached, length)[:, None]
        chunks.append(
            PrefillChunk(
                starts[i], starts[i + 1], cached, pool_rows(used, kv_heads, num_blocks, mask.device), mask
            )
        )
        most = max(most, len(used))
    decode_rows = decode_mask = None
    num_decodes = 0
    if decode is not None:
        tables, dlens = decode
        num_decodes, most = len(dlens), max(most, tables.numel())
        decode_rows = pool_rows(tables.flatten().tolist(), kv_heads, num_blocks, tables.device)
        key_pos = torch.arange(tables.shape[1] * block_size)
        decode_mask = (key_pos[None, :] < dlens[:, None])[:, None, None, :]
    size = most * kv_heads * block_size * head_dim
    buffers = (torch.empty(size, dtype=case.k_cache.dtype), torch.empty(size, dtype=case.k_cache.dtype))
    empty = torch.empty(0, dtype=torch.int64)
    return AttentionMetadata(
        empty, empty, num_decodes, decode_rows, decode_mask, None, None, chunks, None, buffers
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(FEATURES))
def test_pytorch_paths_match_the_reference(dtype, name):
    """Three decode rows (q rows 0-2, their tables' blocks before the window NULL_BLOCK) and the prefill
    chunks of one step through paged_attention's PyTorch paths (the ones CUDA takes)."""
    features = for_heads(FEATURES[name], 9)
    case = prefill_case(dtype, (9, 3, 64), 16)
    gen = torch.Generator().manual_seed(3)
    lens = torch.tensor([17, 100, 150])
    tables = torch.stack([torch.randperm(case.k_cache.shape[1], generator=gen)[:10] for _ in lens])
    expected_decode = reference_decode(
        case.q[:3], case.k_cache, case.v_cache, tables, lens, (1.0, 1.0), features
    )
    for row, first in enumerate(first_keys([n - 1 for n in lens.tolist()], features.sliding_window)):
        tables[row, : first // 16] = -1  # freed: gathered as block 0, masked
    meta = torch_metadata(case, decode=(tables, lens))
    k, v = rows_from_pool(case)
    out = paged_attention(case.q, k, v, case.k_cache, case.v_cache, meta, case.scale, **features.kwargs())
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out[:3].double(), expected_decode, atol=tol, rtol=tol)
    first, end = case.rows
    torch.testing.assert_close(
        out[first:end].double(), reference_prefill_features(case, features), atol=tol, rtol=tol
    )


def rows_from_pool(case) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v [T, KVH, D]: each chunk row's key and value as the pool holds them (as after the step's cache
    write; a first chunk attends over these rows, not the pool)."""
    kv_heads, _, block_size, head_dim = case.k_cache.shape
    starts, lens = case.inputs.query_start_loc.tolist(), case.inputs.seq_lens.tolist()
    k, v = (torch.zeros(case.q.shape[0], kv_heads, head_dim, dtype=case.q.dtype) for _ in range(2))
    for i, length in enumerate(lens):
        blocks = case.inputs.block_tables[i, : -(-length // block_size)]
        n = starts[i + 1] - starts[i]
        for rows, cache in ((k, case.k_cache), (v, case.v_cache)):
            rows[starts[i] : starts[i + 1]] = (
                cache[:, blocks].reshape(kv_heads, -1, head_dim)[:, length - n : length].transpose(0, 1)
            )
    return k, v


@pytest.mark.parametrize(
    ("features", "message"),
    [
        (Features(sliding_window=0), "sliding_window must be a whole number of tokens >= 1"),
        (Features(soft_cap=0.0), "soft_cap must be > 0"),
        (Features(sinks=torch.zeros(4)), r"sinks must hold one logit per query head \(9\)"),
    ],
)
def test_bad_features_are_refused_with_what_is_allowed(features, message):
    case = prefill_case(torch.float32, (9, 3, 64), 16, chunks=((5, 0),))
    k, v = rows_from_pool(case)
    with pytest.raises(ValueError, match=message):
        paged_attention(
            case.q, k, v, case.k_cache, case.v_cache, torch_metadata(case), case.scale, **features.kwargs()
        )
