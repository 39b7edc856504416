"""MXFP4 weights kept as stored (quantization/mxfp4.py, csrc/mxfp4.h) and their fused kernels.

Decoding is bit-exact: gpt-oss's *_blocks / *_scales moved into GGUF's block_mxfp4 decode (in PyTorch and in
csrc/quantized.cpp) to gguf-py's dequantize bit for bit for all 256 scale bytes, and to transformers'
convert_moe_packed_tensors in fp32 for every scale byte it defines (0-254), bit for bit but for the sign of
code 8's zero (transformers' -0.0, ggml's +0.0); the 16-row panels give the blocks back byte for byte.

"Bit-exact against dequantize + fp32 matmul" for the fused dequantize-and-multiply kernels (interleaved.cpp's
VDPBF16PS tiles with bf16 x, quantized.cpp's column loop with fp32 x) compares the kernel's output, bit for
bit, with torch's fp32 x @ dequantize(W)^T rounded to the output's dtype, on inputs whose products and
partial sums are all exact in fp32 (x a multiple of 1/8 in [-1/2, 1/2], scales 2^-2 .. 2^1: every partial sum
a multiple of 2^-6 below 2^13), checked against float64 first: there no summation order can change a bit,
so any difference is a decoding, layout or scaling error. On random inputs the kernels stay within fp32
summation error (the fp32 sums' order is the kernels' own). A nibble-swapped layout and one changed scale
byte fail the bit-exact check.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType, dequantize
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from backend.engine import cpu_kernels
from backend.engine.quantization import mxfp4
from backend.engine.quantization.interleaved import Interleaved
from tests.gemm_utils import within_summation_error

needs_kernels = pytest.mark.skipif(
    not cpu_kernels.supports(torch.device("cpu"), torch.float32),
    reason="the native CPU kernels are not built here",
)
needs_interleaved = pytest.mark.skipif(
    not cpu_kernels.supports(torch.device("cpu"), torch.bfloat16) or not cpu_kernels.interleaved_available(),
    reason="the kernels' build lacks AVX512_BF16 (no interleaved kernel)",
)
ROWS, COLS = 48, 512


def gpt_oss_tensors(experts: int, rows: int, cols: int, scales: tuple[int, int], seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (experts, rows, cols // 32, 16), generator=generator, dtype=torch.uint8)
    scale = torch.randint(scales[0], scales[1] + 1, (experts, rows, cols // 32), generator=generator)
    return blocks, scale.to(torch.uint8)


def exact_inputs(rows: int, seed: int = 0) -> torch.Tensor:
    """x whose products with weights of scales 2^-2 .. 2^1 and partial sums are exact in fp32."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, (rows, COLS), generator=generator).float() / 8


@pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning"
)  # gguf-py: scale byte 255 x 12 is past fp32 (inf)
def test_decoding_is_transformers_and_gguf_bit_for_bit():
    blocks, scales = gpt_oss_tensors(2, 64, 256, (0, 255))
    weight = mxfp4.from_gpt_oss(blocks, scales)
    ours = mxfp4.dequantize(weight.data)
    gguf = torch.from_numpy(dequantize(weight.data.numpy(), GGMLQuantizationType.MXFP4)).view(ours.shape)
    assert torch.equal(ours.view(torch.int32), gguf.view(torch.int32))  # every bit, signs of zero included
    defined = (scales < 255).repeat_interleave(32, -1).reshape(ours.shape)  # transformers: 2^128 = inf
    theirs = (
        convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2).reshape(ours.shape)
    )
    nonzero = defined & (theirs != 0)
    assert torch.equal(ours[defined], theirs[defined])  # as values (-0.0 == 0.0)
    assert torch.equal(ours[nonzero].view(torch.int32), theirs[nonzero].view(torch.int32))


@needs_kernels
def test_native_decoding_is_bit_for_bit():
    """fp32 for every scale byte; bf16 (every MXFP4 value is exact in it) from scale byte 2 on: below, the
    values are fp32 subnormals, which the bf16 conversion instruction (VCVTNE2PS2BF16) flushes to zero."""
    for dtype, scales in ((torch.float32, (0, 255)), (torch.bfloat16, (2, 255))):
        weight = mxfp4.from_gpt_oss(*gpt_oss_tensors(1, 64, 256, scales, seed=1))
        reference = mxfp4.dequantize(weight.data)
        out = torch.empty(weight.shape, dtype=dtype)
        cpu_kernels.quant_dequant(weight.data, "mxfp4", out)
        assert torch.equal(out.float().view(torch.int32), reference.view(torch.int32)), dtype


def test_panels_move_bytes_only():
    weight = mxfp4.from_gpt_oss(*gpt_oss_tensors(2, ROWS, COLS, (100, 140)))
    panels = mxfp4.interleave(weight)
    assert panels.data.numel() == weight.data.numel() and not torch.equal(
        panels.data.view(-1), weight.data.view(-1)
    )
    assert torch.equal(mxfp4.deinterleave(panels).data, weight.data)


def bit_exact(out: torch.Tensor, x: torch.Tensor, reference_weight: torch.Tensor) -> bool:
    """out equals torch's fp32 x @ W^T rounded to out's dtype, bit for bit (the sums being exact)."""
    exact = x.double() @ reference_weight.double().T
    fp32 = x.float() @ reference_weight.T
    assert torch.equal(fp32.double(), exact), "inputs whose sums are exact in fp32"
    bits = torch.int16 if out.dtype == torch.bfloat16 else torch.int32
    return torch.equal(out.view(bits), fp32.to(out.dtype).view(bits))


def mxfp4_panels(scales: tuple[int, int], seed: int) -> tuple[Interleaved, torch.Tensor]:
    weight = mxfp4.from_gpt_oss(*gpt_oss_tensors(1, ROWS, COLS, scales, seed))
    return mxfp4.interleave(weight), mxfp4.dequantize(weight.data)


@needs_interleaved
def test_fused_interleaved_kernel_bit_exact():
    """Tiles of 1-8 rows x 1-3 panels, rows past 8 in several tiles (AMX tiles from 8 rows on AMX CPUs)."""
    panels, reference = mxfp4_panels((125, 128), seed=2)
    for rows in (1, 2, 3, 5, 8, 9, 17, 64):
        x = exact_inputs(rows, seed=rows).bfloat16()
        out = torch.empty(rows, ROWS, dtype=torch.bfloat16)
        cpu_kernels.interleaved_gemm(x, panels, None, out)
        assert bit_exact(out, x, reference), rows


@needs_kernels
def test_fused_rows_kernel_bit_exact():
    weight = mxfp4.from_gpt_oss(*gpt_oss_tensors(1, ROWS, COLS, (125, 128), seed=3))
    reference = mxfp4.dequantize(weight.data)
    for rows in (1, 3, 8):
        x = exact_inputs(rows, seed=rows)
        out = torch.empty(rows, ROWS)
        cpu_kernels.quant_gemv(x, weight.data, "mxfp4", None, out)
        assert bit_exact(out, x, reference), rows


@needs_interleaved
def test_random_inputs_within_summation_error():
    panels, reference = mxfp4_panels((118, 130), seed=4)
    bias = torch.randn(ROWS).bfloat16()
    for rows in (1, 4, 7, 16, 130):
        x = torch.randn(rows, COLS).bfloat16()
        out = torch.empty(rows, ROWS, dtype=torch.bfloat16)
        cpu_kernels.interleaved_gemm(x, panels, bias, out)
        assert within_summation_error(out, x, reference, bias), rows


@needs_interleaved
@pytest.mark.parametrize("bug", ["nibbles_swapped", "scale_changed"])
def test_planted_layout_bugs_fail(bug):
    """nibbles_swapped: each chunk's two k-pairs exchanged (the layout's nibble order wrong); scale_changed:
    panel 1's first block's row-0 scale one step larger."""
    panels, reference = mxfp4_panels((125, 128), seed=5)
    data = panels.data.view(ROWS // 16, COLS // 32, -1).clone()
    if bug == "nibbles_swapped":
        data[..., 16:] = (data[..., 16:] >> 4) | (data[..., 16:] << 4)
    else:
        data[1, 0, 0] += 1
    planted = Interleaved("mxfp4", data.view(ROWS // 16, -1), panels.shape)
    x = exact_inputs(4).bfloat16()
    out = torch.empty(4, ROWS, dtype=torch.bfloat16)
    cpu_kernels.interleaved_gemm(x, planted, None, out)
    assert not bit_exact(out, x, reference)
