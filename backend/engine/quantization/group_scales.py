"""The per-group scales and zeros of GPTQ / AWQ / compressed-tensors 4- and 8-bit weights (and fp8 weights'
per-channel scales) held in
csrc/interleaved.cpp's 16-row layout (interleaved.Interleaved with a `groups`): what its packed kinds read
beside the interleaved integers (csrc/interleaved_kinds.h Groups).

They are the checkpoint's own tensors (so the weights hold the bytes the checkpoint stores): scales as
[groups, n] (GPTQ's and AWQ's layout; compressed-tensors' [n, groups] transposed), zeros as packed int32
[groups, n / f] in plain order (row j's field at bits * (j % f) of int32 j / f: GPTQ's, AWQ's after
row_packed put its nibbles in order, compressed-tensors' transposed), a stored-but-unread g_idx kept for
its bytes. Symmetric weights (every zero 8 for 4 bits, 128 for 8 bits: GPTQ sym, compressed-tensors sym)
take the kinds without zeros ("w4", "w8", their zeros kept unread); the others "w4_zp" / "w8_zp". The
interleaved 8-bit integers of "w8" are stored as int8 q - 128 (the same bytes, each flipped in its top
bit), so that they decode as Q8_0's do. fp8 e4m3 weights with one scale a row take "fp8" (a tensor-wide
scale keeps the row layout).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from backend.engine.quantization.row_packed import Layout, RowPacked

MIDDLE = {4: 8, 8: 128}  # the zero of symmetric weights
_EMPTY = torch.zeros(0, dtype=torch.uint8)


class GroupArgs(ctypes.Structure):
    """csrc/interleaved_kinds.h Groups: pointers into the tensors of one GroupScales, and sizes."""

    _fields_ = [
        ("scales", ctypes.c_void_p),
        ("zeros", ctypes.c_void_p),
        ("perm", ctypes.c_void_p),
        ("group_size", ctypes.c_int64),
        ("scale_dtype", ctypes.c_int64),
        ("zero_add", ctypes.c_int64),
    ]


@dataclass(slots=True)
class GroupScales:
    qtype: str  # the interleaved kind: "w4" | "w4_zp" | "w8" | "w8_zp" | "fp8"
    rows: RowPacked  # scales [groups, n], zeros [groups, n / f], perm, kept, layout (its qweight empty)
    args: GroupArgs  # what the kernel reads (pointers into rows' tensors, which this object keeps alive)

    def tensors(self) -> list[torch.Tensor]:
        return self.rows.tensors()[1:]

    def decode(self, rows: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """W[first:last] as float32 from those rows' integers in row_packed's layout [last - first, bytes]."""
        if self.qtype == "w8":
            rows = rows ^ 0x80  # back to the stored q + 128
        return self.rows.decode(rows, first, last)

    @property
    def address(self) -> int:
        return ctypes.addressof(self.args)


def _scales(part: RowPacked, groups: int) -> torch.Tensor | None:
    """part's scales as [groups, n], or None where they are not one a (row, group)."""
    n, lay = part.shape[0], part.layout
    if lay.scale_row == 1 and (groups == 1 or lay.scale_group == n):
        return part.scales.reshape(groups, n)
    if lay.scale_group == 1 and lay.scale_row == groups:
        return part.scales.reshape(n, groups).t().contiguous()
    return None


def _zeros(part: RowPacked, groups: int) -> torch.Tensor | None:
    """part's packed zeros as [groups, n / f] (empty when symmetric by construction or fp8), or None."""
    lay, f = part.layout, 32 // _bits(part)
    if not part.zeros.numel():
        return part.zeros if part.kind == "fp8" or lay.zero_const == MIDDLE[_bits(part)] else None
    if lay.zero_group == 1 and lay.zero_pack == groups:
        return part.zeros.reshape(-1, groups).t().contiguous()
    if lay.zero_pack == 1 and lay.zero_group * f == part.shape[0]:
        return part.zeros.reshape(groups, -1)
    return None


def _bits(part: RowPacked) -> int:
    return 4 if part.kind == "w4" else 8


def _is_symmetric(zeros: torch.Tensor, bits: int, zero_add: int) -> bool:
    if not zeros.numel():
        return True
    fields = (zeros.unsqueeze(-1) >> torch.arange(0, 32, bits, dtype=torch.int32)) & ((1 << bits) - 1)
    return bool((fields + zero_add == MIDDLE[bits]).all())


def group_scales(part: RowPacked) -> GroupScales | None:
    """part's scales and zeros for the interleaved kinds, or None where they cannot take them (fp8; rows not a
    multiple of 16; one scale for the whole tensor)."""
    n, k = part.shape
    if n % 16 or part.qweight.device.type != "cpu":
        return None
    groups = k // part.layout.group_size
    scales, zeros = _scales(part, groups), _zeros(part, groups)
    if scales is None or zeros is None:
        return None
    bits, add = _bits(part), part.layout.zero_add
    qtype = f"w{bits}" if _is_symmetric(zeros, bits, add) else f"w{bits}_zp"
    if part.kind == "fp8":
        qtype = "fp8"
    return _build(qtype, part, scales, zeros, part.perm, part.kept)


def _build(qtype, part: RowPacked, scales, zeros, perm, kept) -> GroupScales:
    n, k = scales.shape[1], part.shape[1]
    lay, f = part.layout, 32 // _bits(part)
    const = MIDDLE[_bits(part)] if not zeros.numel() and part.kind != "fp8" else 0
    layout = Layout(n, k, lay.group_size, 1, n, lay.scale_dtype, 1, n // f, lay.zero_add, const)
    rows = RowPacked(part.kind, part.source, _EMPTY, scales, zeros, perm, layout, (n, k), kept)
    read_zeros = zeros.numel() and qtype.endswith("_zp")
    args = GroupArgs(
        scales.data_ptr(),
        zeros.data_ptr() if read_zeros else None,
        None if perm is None else perm.data_ptr(),
        lay.group_size,
        lay.scale_dtype,
        lay.zero_add,
    )
    return GroupScales(qtype, rows, args)


def join(first: GroupScales, second: GroupScales) -> GroupScales | None:
    """The groups of two parts stacked along n (a fused projection's q, k and v: one kernel call), or None
    where they differ in kind, group size, scale type, zeros or input order. A second act-order
    permutation equal to the first is kept unread (its bytes stay counted)."""
    a, b = first.rows, second.rows
    la, lb = a.layout, b.layout
    same_perm = a.perm is None and b.perm is None
    if a.perm is not None and b.perm is not None:
        same_perm = torch.equal(a.perm, b.perm)
    if (first.qtype, la.group_size, la.scale_dtype, la.zero_add, la.zero_const) != (
        second.qtype,
        lb.group_size,
        lb.scale_dtype,
        lb.zero_add,
        lb.zero_const,
    ) or not same_perm:
        return None
    scales = torch.cat((a.scales, b.scales), 1)
    zeros = torch.cat((a.zeros, b.zeros), 1) if a.zeros.numel() else a.zeros
    kept = [*a.kept, *b.kept, *([] if b.perm is None else [b.perm])]
    return _build(first.qtype, a, scales, zeros, a.perm, kept)
