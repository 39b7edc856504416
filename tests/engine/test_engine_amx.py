"""The AMX-tile paths of the native GEMMs (CPUs with AMX: csrc/gemm_amx.h for dense bf16,
csrc/interleaved_amx.h for GGUF / packed quantized weights): at every row count around their tiles' 16
and blocks' 32 rows, on one and two threads, each within fp32 summation error and one bf16 rounding of
the exact product, as the VDPBF16PS path is for the same call (the library's count of tile runs shows
which path a call took); the fused SiLU-and-multiply equals the separate kernels bit for bit; and the row
count from which the engine takes the tiles is the one cpu_kernels sets. Skipped where the CPU has no AMX
or Linux does not grant the tile state (the VDPBF16PS paths are tested there by test_engine_gemm_bf16
and test_engine_interleaved)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from backend.engine import cpu_kernels
from backend.engine.quantization.gguf_blocks import KEPT_TYPES
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.interleaved import interleave
from tests.gemm_utils import within_rounding, within_summation_error
from tests.gguf_utils import Q, random_blocks

pytestmark = pytest.mark.skipif(
    cpu_kernels.gemm_amx_min_rows() == 0, reason="no AMX tiles here (a CPU without AMX, or not granted)"
)
ROWS = [8, 15, 16, 17, 31, 32, 33, 64, 130]


@contextlib.contextmanager
def tiles_from(rows: int, threads: int = 2):
    """Both kernels take AMX tiles from rows rows (0: never) on threads threads, for the block's calls."""
    library = cpu_kernels.load_library()
    previous = torch.get_num_threads()
    library.gemm_amx_set_min_rows(rows)
    library.interleaved_amx_set_min_rows(rows)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        library.gemm_amx_set_min_rows(cpu_kernels.gemm_amx_min_rows())
        library.interleaved_amx_set_min_rows(cpu_kernels.interleaved_amx_min_rows())
        torch.set_num_threads(previous)


def tile_runs() -> int:
    library = cpu_kernels.load_library()
    assert library is not None
    return int(library.amx_tile_runs())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(200, 96), (49, 1536), (960, 576)])
def test_dense_gemm_on_tiles_within_rounding(n, k, threads):
    gen = torch.Generator().manual_seed(n + k)
    weight = torch.randn(n, k, generator=gen).bfloat16()
    packed = cpu_kernels.gemm_bf16_pack(weight)
    for rows in ROWS:
        x = torch.randn(rows, k, generator=gen).bfloat16()
        bias = torch.randn(n, generator=gen).bfloat16() if rows % 2 else None
        before = tile_runs()
        with tiles_from(1, threads):
            amx = cpu_kernels.gemm_bf16(x, packed, n, bias)
            logits = cpu_kernels.gemm_bf16(x, packed, n, bias, torch.float32)  # an lm_head's float_out
        ran = tile_runs()
        with tiles_from(0, threads):
            vector = cpu_kernels.gemm_bf16(x, packed, n, bias)
        assert ran > before and tile_runs() == ran  # the tiles ran, then did not
        assert within_rounding(amx, x, weight, bias), rows
        assert within_rounding(vector, x, weight, bias), rows
        assert torch.equal(logits, amx.float())


@pytest.mark.parametrize("rows", [8, 17, 64, 131])
def test_fused_silu_and_mul_on_tiles_equals_the_separate_kernels(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = (
        torch.randn(3072, 576, generator=gen).bfloat16(),
        torch.randn(3072, generator=gen).bfloat16(),
    )
    x = torch.randn(rows, 576, generator=gen).bfloat16()
    packed, fused_bias = cpu_kernels.pack_gate_up(weight, bias)
    before = tile_runs()
    with tiles_from(1):
        fused = cpu_kernels.gemm_bf16_silu_and_mul(x, packed, 3072, fused_bias)
    assert tile_runs() > before
    with tiles_from(1):
        separate = cpu_kernels.silu_and_mul(
            cpu_kernels.gemm_bf16(x, cpu_kernels.gemm_bf16_pack(weight), 3072, bias)
        )
    assert torch.equal(fused, separate)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0], ids=lambda t: t.name)
def test_quantized_gemm_on_tiles_within_summation_error(qtype, threads):
    n, k = 64, 544  # 17 blocks a row
    from gguf import dequantize

    data = random_blocks(qtype, n, k, np.random.default_rng(3))
    reference = torch.from_numpy(dequantize(data, qtype)).reshape(n, k)
    part = interleave(QuantizedWeight(KEPT_TYPES[qtype], torch.from_numpy(data), (n, k)))
    gen = torch.Generator().manual_seed(int(qtype))
    bias = torch.randn(n, generator=gen).bfloat16()
    for rows in [16, 17, 31, 40, 130]:
        x = torch.randn(rows, k, generator=gen).bfloat16()
        for amx_from in (1, 0):
            out = torch.full((rows, n + 3), 7.0, dtype=torch.bfloat16)  # ldy > n: nothing written past n
            before = tile_runs()
            with tiles_from(amx_from, threads):
                cpu_kernels.interleaved_gemm(x, part, bias, out[:, :n])
            assert (tile_runs() > before) == (amx_from == 1)  # the path asked for is the one that ran
            assert within_summation_error(out[:, :n], x, reference, bias), (rows, amx_from)
            assert (out[:, n:] == 7.0).all()


def test_the_engine_takes_tiles_from_the_rows_cpu_kernels_sets(monkeypatch):
    """cpu_kernels' row counts (and their environment switches) are what the library is told at load."""
    assert cpu_kernels.gemm_amx_min_rows() == cpu_kernels.GEMM_AMX_MIN_ROWS
    assert cpu_kernels.interleaved_amx_min_rows() == cpu_kernels.INTERLEAVED_AMX_MIN_ROWS
    monkeypatch.setenv("PLAYGROUND_GEMM_AMX_MIN_ROWS", "0")
    monkeypatch.setenv("PLAYGROUND_INTERLEAVED_AMX_MIN_ROWS", "64")
    assert (cpu_kernels.gemm_amx_min_rows(), cpu_kernels.interleaved_amx_min_rows()) == (0, 64)
    monkeypatch.setenv("PLAYGROUND_GEMM_AMX_MIN_ROWS", "eight")  # not a number: said and ignored
    assert cpu_kernels.gemm_amx_min_rows() == cpu_kernels.GEMM_AMX_MIN_ROWS
