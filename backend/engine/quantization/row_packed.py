"""Packed-integer and fp8 weights re-laid out at load into the row layout of the CPU kernels
(csrc/packed_rows.cpp), in the same number of bytes as the checkpoint holds them.

GPTQ (qweight packs input rows), AWQ (output columns in the order 0 2 4 6 1 3 5 7) and compressed-tensors
pack-quantized (input columns) all become RowPacked: output row j's k integers in 32-weight chunks (4-bit:
16 bytes, byte i holding weight i in its low nibble and i + 16 in its high one; 8-bit: 32 bytes). Scales
stay the checkpoint's tensor and zeros its packed int32 tensor (AWQ's nibbles put in plain order), read
through strides (Layout); act-order (desc_act / actorder) g_idx becomes an input permutation that makes
every group contiguous (perm, in g_idx's place). fp8 e4m3 weights are already rows of bytes: viewed, not
copied. dequantize_rows is the PyTorch path (CUDA, no compiler) and the reference the kernels are tested
against; it equals the source format's own dequantize_rows exactly (tests/engine/test_engine_packed_rows.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import torch

from backend.engine.quantization.compressed_tensors import Fp8Weight
from backend.engine.quantization.gptq_awq import AWQ_ORDER, PackedWeight, unpack_columns, unpack_rows

CHUNK = 32  # weights per kernel chunk: k and group sizes must be multiples
SCALE_TYPES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}  # csrc/packed_rows.cpp ScaleType


class Layout(ctypes.Structure):
    """csrc/packed_rows.cpp PackedLayout: sizes and the strides the kernels read scales and zeros with."""

    FIELDS = "n k group_size scale_row scale_group scale_dtype zero_pack zero_group zero_add zero_const"
    _fields_ = [(name, ctypes.c_int64) for name in FIELDS.split()]


@dataclass(slots=True)
class RowPacked:
    kind: str  # the kernel: "w4" | "w8" | "fp8"
    source: str  # what the checkpoint held: "gptq" | "awq" | "compressed-tensors" | "fp8"
    qweight: torch.Tensor  # [n, k * bits / 8] uint8 rows
    scales: torch.Tensor  # the checkpoint's scales, contiguous
    zeros: torch.Tensor  # packed int32 zeros, or empty (symmetric: layout.zero_const)
    perm: torch.Tensor | None  # [k] int32: weight column i multiplies x[perm[i]] (act-order), or None
    layout: Layout
    shape: tuple[int, int]
    kept: list[torch.Tensor] = field(default_factory=list)  # stored, unread (a trivial g_idx): counted

    row_multiple = 1

    def tensors(self) -> list[torch.Tensor]:
        perm = [] if self.perm is None else [self.perm]
        return [self.qweight, self.scales, self.zeros, *perm, *self.kept]

    def dequantize_rows(self, first: int, last: int) -> torch.Tensor:
        """W[first:last] as float32 [last - first, k], computed as the kernels compute it."""
        return self.decode(self.qweight[first:last], first, last)

    def decode(self, rows: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """W[first:last] as float32 from rows [last - first, k * bits / 8]: those rows in this layout."""
        k, lay = self.shape[1], self.layout
        j, g = torch.arange(first, last).view(-1, 1), torch.arange(k // lay.group_size).view(1, -1)
        scales = self.scales.reshape(-1)[j * lay.scale_row + g * lay.scale_group].float()
        scales = scales.repeat_interleave(lay.group_size, 1)
        if self.kind == "fp8":
            w = rows.view(torch.float8_e4m3fn).float() * scales
        else:
            q = rows.int()
            if self.kind == "w4":
                q = q.view(last - first, -1, 1, 16)
                q = torch.cat((q & 15, q >> 4), 2).reshape(last - first, k)
            w = (q - self.zero_points(j, g).repeat_interleave(lay.group_size, 1)).float() * scales
        if self.perm is None:
            return w
        out = torch.empty_like(w)
        out[:, self.perm.long()] = w
        return out

    def zero_points(self, j: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        lay = self.layout
        if not self.zeros.numel():
            return torch.full((j.shape[0], g.shape[1]), lay.zero_const, dtype=torch.int32)
        bits = 4 if self.kind == "w4" else 8
        f = 32 // bits
        packed = self.zeros.reshape(-1)[(j // f) * lay.zero_pack + g * lay.zero_group]
        return ((packed >> (bits * (j % f))) & ((1 << bits) - 1)) + lay.zero_add


def relayout(part):
    """part in the kernels' row layout, or part itself where that layout cannot hold it (not on the CPU,
    k or a group not a multiple of 32, groups of unequal size, a scale dtype the kernels do not read)."""
    if isinstance(part, PackedWeight):
        return _from_packed(part)
    if isinstance(part, Fp8Weight):
        return _from_fp8(part)
    return part


def _from_fp8(part: Fp8Weight):
    n, k = part.shape
    scale = part.scale.contiguous()
    if part.weight.device.type != "cpu" or k % CHUNK or scale.dtype not in SCALE_TYPES:
        return part
    if scale.numel() not in (1, n):
        return part
    row = 0 if scale.numel() == 1 else 1
    layout = Layout(n, k, k, row, 0, SCALE_TYPES[scale.dtype], 0, 0, 0, 0)
    qweight = part.weight.contiguous().view(torch.uint8)
    return RowPacked("fp8", "fp8", qweight, scale, _NO_ZEROS, None, layout, (n, k))


_NO_ZEROS = torch.zeros(0, dtype=torch.int32)


def _integers(part: PackedWeight) -> torch.Tensor:
    """[n, k] the stored integers of part (offsets included), in their checkpoint's column order."""
    if part.method == "gptq":
        return unpack_rows(part.qweight, part.bits).t()
    if part.method == "awq":
        return unpack_columns(part.qweight, part.bits, AWQ_ORDER).t()
    return unpack_columns(part.qweight, part.bits, None)[:, : part.shape[1]]


def _plain_order(packed: torch.Tensor) -> torch.Tensor:
    """AWQ-packed int32 [m, n / 8] with its nibbles moved to plain order (column c * 8 + i at bits 4 i)."""
    fields = unpack_columns(packed, 4, AWQ_ORDER).to(torch.int64).view(packed.shape[0], -1, 8)
    plain = sum(fields[..., i] << (4 * i) for i in range(8))
    return torch.as_tensor(plain).to(torch.uint32).view(torch.int32).contiguous()


def _scale_strides(part: PackedWeight, groups: int) -> tuple[int, int]:
    n = part.shape[0]
    if part.scales.numel() == 1:
        return 0, 0
    return (1, n) if part.method != "compressed-tensors" else (groups, 1)


def _zeros(part: PackedWeight) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    """(packed zeros, (zero_pack, zero_group, zero_add, zero_const)) of part for the kernels."""
    if part.method == "gptq":  # [groups, n / f], stored zero - 1
        return part.qzeros.contiguous(), (1, part.qzeros.shape[1], 1, 0)
    if part.method == "awq":
        return _plain_order(part.qzeros), (1, part.qzeros.shape[1], 0, 0)
    if not part.qzeros.numel():  # compressed-tensors symmetric: stored q + 2^(bits - 1)
        return _NO_ZEROS, (0, 0, 0, 1 << (part.bits - 1))
    return part.qzeros.contiguous(), (part.qzeros.shape[1], 1, 0, 0)  # [n / f, groups], offset as q is


def _from_packed(part: PackedWeight):
    n, k = part.shape
    if part.qweight.device.type != "cpu" or k % CHUNK or part.scales.dtype not in SCALE_TYPES:
        return part
    groups = int(part.g_idx.max()) + 1
    group_size = k // groups
    if k % groups or group_size % CHUNK:
        return part
    expected = torch.arange(k) // group_size
    perm = None
    if not torch.equal(part.g_idx.long(), expected):
        perm = torch.argsort(part.g_idx.long(), stable=True)
        if not torch.equal(part.g_idx.long()[perm], expected):
            return part
    q = _integers(part)
    if perm is not None:
        q = q[:, perm]
    if part.bits == 4:
        q = q.reshape(n, -1, 2, 16)
        qweight = (q[:, :, 0] | (q[:, :, 1] << 4)).to(torch.uint8).contiguous().view(n, k // 2)
    else:
        qweight = q.to(torch.uint8).contiguous()
    zeros, (pack, group, add, const) = _zeros(part)
    scale_row, scale_group = _scale_strides(part, groups)
    scales = part.scales.contiguous()
    layout = Layout(
        n, k, group_size, scale_row, scale_group, SCALE_TYPES[scales.dtype], pack, group, add, const
    )
    stored = [part.g_idx] if part.g_idx_stored else []
    if perm is not None and stored and part.g_idx.dtype == torch.int32:
        stored = []  # perm takes the stored g_idx's place (and bytes)
    perm = None if perm is None else perm.to(torch.int32)
    kind = "w4" if part.bits == 4 else "w8"
    return RowPacked(kind, part.method, qweight, scales, zeros, perm, layout, (n, k), stored)
