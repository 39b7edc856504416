"""GPTQ, AWQ, compressed-tensors pack-quantized and fp8 weights re-laid out for the CPU kernels
(row_packed.RowPacked, csrc/packed_rows.cpp): the re-layout is exact (the same weights, the same bytes) and
the kernels compute what the PyTorch decoding computes, on this CPU's build and on the AVX2 and plain C++
builds (PLAYGROUND_CPU_KERNELS_MARCH)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from backend.engine import cpu_kernels
from backend.engine.quantization.compressed_tensors import Fp8Weight
from backend.engine.quantization.gptq_awq import PACKED_SUFFIXES, PackedWeight
from backend.engine.quantization.row_packed import RowPacked, relayout
from benchmarks.quant_checkpoints import Scheme, pack_columns, pack_rows, packed_tensors
from tests.common_utils import ROOT

pytestmark = pytest.mark.usefixtures("one_torch_thread")
needs_kernels = pytest.mark.skipif(
    not cpu_kernels.supports(torch.device("cpu"), torch.float32), reason="no C++ compiler: PyTorch paths only"
)
N, K = 72, 256  # N not a multiple of 8 zeros a packed int32 holds... (72 = 9 x 8) nor of 16


def gptq_awq(scheme: Scheme, seed: int = 1) -> PackedWeight:
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed))
    tensors, _ = packed_tensors("p", w, scheme, seed=seed)
    g_idx = tensors.get("p.g_idx", torch.arange(K) // (K if scheme.group_size == -1 else scheme.group_size))
    parts = [tensors[f"p.{s}"] for s in PACKED_SUFFIXES[:3]]
    return PackedWeight(scheme.method, scheme.bits, *parts, g_idx, (N, K), "p.g_idx" in tensors)


def compressed(bits: int, group: int, sym: bool, actorder: bool, scale_dtype=torch.bfloat16) -> PackedWeight:
    """compressed-tensors pack-quantized (pack_to_int32's layout): weight_packed [n, k / f] along input
    columns, weight_zero_point [n / f, groups] along output rows, both stored with a 2^(bits-1) offset."""
    gen = torch.Generator().manual_seed(bits + group)
    groups = K // group
    q = torch.randint(0, 1 << bits, (N, K), generator=gen)
    scales = (torch.rand(N, groups, generator=gen) / 8 + 1e-3).to(scale_dtype)
    zeros = torch.zeros(0, dtype=torch.int32)
    if not sym:
        zeros = pack_rows(torch.randint(0, 1 << bits, (N, groups), generator=gen), bits)
    g_idx = torch.arange(K) // group
    if actorder:
        g_idx = g_idx[torch.randperm(K, generator=gen)]
    packed = pack_columns(q, bits)
    return PackedWeight("compressed-tensors", bits, packed, zeros, scales, g_idx.int(), (N, K), actorder)


def fp8(per_channel: bool, finite: bool = True) -> Fp8Weight:
    gen = torch.Generator().manual_seed(8)
    codes = torch.randint(0, 256, (N, K), generator=gen, dtype=torch.uint8)
    codes[0, :256] = torch.arange(256, dtype=torch.uint8)  # every e4m3 code, subnormals and NaN included
    if finite:
        codes[(codes & 0x7F) == 0x7F] = 0x3C  # no NaN (a NaN weight makes a NaN product)
    scale = torch.rand(N if per_channel else 1, 1, generator=gen) / 4
    return Fp8Weight(
        codes.view(torch.float8_e4m3fn), scale.reshape(-1, 1) if per_channel else scale[0], (N, K)
    )


PARTS = {
    "gptq-w4-g128-sym": lambda: gptq_awq(Scheme("gptq", 4, 128, sym=True)),
    "gptq-w4-g32-desc_act-asym": lambda: gptq_awq(Scheme("gptq", 4, 32, desc_act=True)),
    "gptq-w8-g64-desc_act-sym": lambda: gptq_awq(Scheme("gptq", 8, 64, desc_act=True, sym=True)),
    "gptq-w8-channel-asym": lambda: gptq_awq(Scheme("gptq", 8, -1)),
    "awq-w4-g128": lambda: gptq_awq(Scheme("awq", 4, 128)),
    "awq-w4-g64": lambda: gptq_awq(Scheme("awq", 4, 64)),
    "ct-w4-g32-asym": lambda: compressed(4, 32, sym=False, actorder=False),
    "ct-w4-g128-sym-actorder": lambda: compressed(4, 128, sym=True, actorder=True),
    "ct-w8-channel-sym-fp16": lambda: compressed(8, K, sym=True, actorder=False, scale_dtype=torch.float16),
    "ct-w8-g64-asym-fp32": lambda: compressed(8, 64, sym=False, actorder=False, scale_dtype=torch.float32),
    "fp8-channel": lambda: fp8(per_channel=True),
    "fp8-tensor": lambda: fp8(per_channel=False),
}


def nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("name", PARTS)
def test_relayout_is_exact_and_keeps_the_stored_bytes(name):
    part = PARTS[name]()
    row = relayout(part)
    assert isinstance(row, RowPacked)
    assert nbytes(row.tensors()) == nbytes(part.tensors())
    torch.testing.assert_close(row.dequantize_rows(0, N), part.dequantize_rows(0, N), rtol=0, atol=0)
    torch.testing.assert_close(row.dequantize_rows(24, 40), part.dequantize_rows(24, 40), rtol=0, atol=0)


def test_fp8_every_code_decodes_exactly_in_the_kernel():
    row = relayout(fp8(per_channel=True, finite=False))
    expected = row.qweight[:1].view(torch.float8_e4m3fn).float() * row.scales[0].float()
    decoded = cpu_kernels.packed_dequant(row, 0, 1, torch.empty(1, K))
    torch.testing.assert_close(decoded, expected, rtol=0, atol=0, equal_nan=True)


def check_kernels(name: str) -> None:
    """Every kernel of one part against the PyTorch decoding (also run by the other builds' processes)."""
    row = relayout(PARTS[name]())
    reference = row.dequantize_rows(0, N)
    gen = torch.Generator().manual_seed(4)
    for dtype, tolerance in ((torch.float32, 2e-5), (torch.bfloat16, 2e-2)):
        for rows in (1, 3, 8):
            x = torch.randn(rows, K, generator=gen).to(dtype)
            bias = torch.randn(N, generator=gen).to(dtype)
            out = torch.full((rows, N + 5), 7.0, dtype=dtype)  # a wider row: columns 0..N-1 written only
            cpu_kernels.packed_gemv(x, row, bias, out[:, :N])
            expected = x.float() @ reference.t() + bias.float()
            scale = expected.abs().max().item()
            torch.testing.assert_close(out[:, :N].float(), expected, rtol=tolerance, atol=tolerance * scale)
            assert torch.all(out[:, N:] == 7.0), name
        tile = cpu_kernels.packed_dequant(row, 8, 40, torch.empty(32, K, dtype=dtype))
        torch.testing.assert_close(tile, reference[8:40].to(dtype), rtol=0, atol=0)


@needs_kernels
@pytest.mark.parametrize("name", PARTS)
def test_kernels_match_the_pytorch_decoding(name):
    check_kernels(name)


@needs_kernels
@pytest.mark.slow
@pytest.mark.parametrize(("march", "width"), [("haswell", 8), ("x86-64", 1)])
def test_each_instruction_set_build_computes_the_same(march, width):
    script = (
        "from backend.engine import cpu_kernels\n"
        f"assert cpu_kernels.load_library().quant_vector_width() == {width}\n"
        "from tests.engine.test_engine_packed_rows import PARTS, check_kernels\n"
        "for name in PARTS: check_kernels(name)\n"
        "print('ok')\n"
    )
    env = os.environ | {
        "PLAYGROUND_CPU_KERNELS_MARCH": march,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_takes_the_gemv_in_slices_up_to_64_rows_then_tiles(dtype, monkeypatch):
    from backend.engine.quantization.quantized_linear import PACKED_SLICED_MAX_ROWS, QuantizedLinear, Scratch
    from tests.quant_pack_utils import count_calls

    parts = [PARTS["awq-w4-g64"](), PARTS["ct-w8-g64-asym-fp32"](), PARTS["fp8-channel"]()]  # a fused layer
    layer = QuantizedLinear(parts, True, Scratch(), dtype)
    layer.use_kernel = True
    torch.nn.init.normal_(layer.bias)
    weight = torch.cat([p.dequantize_rows(0, N) for p in parts])
    gemv, tiles = count_calls(monkeypatch, "packed_gemv"), count_calls(monkeypatch, "packed_dequant")
    for rows in (1, 9, 40, PACKED_SLICED_MAX_ROWS + 1):
        x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows)).to(dtype)
        expected = x.float() @ weight.t() + layer.bias.float()
        tolerance = 2e-5 if dtype == torch.float32 else 2e-2
        scale = expected.abs().max().item()
        torch.testing.assert_close(layer(x).float(), expected, rtol=tolerance, atol=tolerance * scale)
    assert gemv[0] == 3 * (1 + 2 + 5)  # 8-row slices of each part up to 64 rows
    assert tiles[0] == 3  # one tile per part beyond
