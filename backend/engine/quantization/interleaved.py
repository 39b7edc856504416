"""GGUF Q4_0 / Q4_1 / Q8_0 weights, and GPTQ / AWQ / compressed-tensors 4- and 8-bit ones, re-laid out at load
with 16 output rows interleaved, the layout of csrc/interleaved.cpp (llama.cpp's CPU repack, block_q4_0x8,
does the same), in the same bytes.

W's rows go in panels of 16; a panel's blocks of 32 weights stay in k order, and each panel-block holds the
16 rows' fp16 scales d[16] (Q4_1: then the mins m[16]) followed by chunks of 32 bytes: 4-bit, 8 chunks,
chunk c's byte 2 r + e holding row r's weight 4 c + e in its low nibble and 4 c + 2 + e in its high one;
Q8_0, 16 chunks, chunk c's byte 2 r + e holding row r's weight 2 c + e. The re-layout
only moves bytes (every d, m and nibble is the GGUF block's own), so decoding it gives gguf-py's values
bit for bit (dequantize_rows, the PyTorch path and the kernels' test reference).
Packed integers (row_packed.RowPacked "w4" / "w8": their chunks are already Q4_0's / Q8_0's quants) move
the same way with no header: their scales and zeros stay the checkpoint's tensors (group_scales), and
dequantize_rows moves the rows back and decodes them as row_packed does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import TypeGuard

import torch

from backend.engine.quantization.gguf_blocks import dequantize
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.group_scales import GroupScales, group_scales, join
from backend.engine.quantization.row_packed import RowPacked

PANEL = 16  # rows a panel (csrc/interleaved.cpp PANEL)
TYPES = {"q4_0": 2, "q4_1": 4, "q8_0": 2}  # kept type -> header bytes of one GGUF block (d; d and m)
HEAD = TYPES | {"w4": 0, "w4_zp": 0, "w8": 0, "w8_zp": 0, "fp8": 0}  # packed kinds (group_scales): no header
EIGHT_BIT = ("q8_0", "w8", "w8_zp", "fp8")


@dataclass(slots=True)
class Interleaved:
    qtype: str  # a key of HEAD
    data: torch.Tensor  # [n / 16, k / 32 * 16 * block bytes] uint8
    shape: tuple[int, int]  # (n, k)
    groups: GroupScales | None = None  # packed kinds: the checkpoint's scales and zeros

    row_multiple = PANEL

    def tensors(self) -> list[torch.Tensor]:
        return [self.data] + ([] if self.groups is None else self.groups.tensors())

    def blocks(self, first: int, last: int) -> torch.Tensor:
        """Rows first..last-1 back in GGUF's block layout [last - first, row bytes]."""
        rows = self.panel_blocks(self.data[first // PANEL : -(-last // PANEL)])
        return rows[first % PANEL : first % PANEL + last - first]

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ids [T] (int64) in GGUF's block layout [T, row bytes] (an embedding lookup)."""
        if self.qtype == "q8_0":  # whole bytes: one gather from the rows' panels
            index = q8_0_row_bytes(self.shape[1]).to(ids.device)
            return self.data.index_select(0, ids // PANEL).gather(1, index[ids % PANEL])
        rows = self.panel_blocks(self.data.index_select(0, ids // PANEL)).view(ids.shape[0], PANEL, -1)
        return rows[torch.arange(ids.shape[0], device=ids.device), ids % PANEL]

    def panel_blocks(self, panels: torch.Tensor) -> torch.Tensor:
        """panels [p, group bytes * blocks] -> their 16 p rows in GGUF's block layout."""
        head, k = HEAD[self.qtype], self.shape[1]
        p = panels.shape[0]
        groups = panels.view(p, k // 32, -1)  # [panels, blocks, group bytes]
        header = groups[..., : PANEL * head].reshape(p, k // 32, head // 2, PANEL, 2).transpose(2, 3)
        if self.qtype in EIGHT_BIT:  # [.., c, r, e] -> [.., r, c, e]: weight 2 c + e
            qs = groups[..., PANEL * head :].reshape(-1, k // 32, 16, PANEL, 2).transpose(2, 3)
            qs = qs.reshape(-1, k // 32, PANEL, 32)
            block = torch.cat((header.reshape(p, k // 32, PANEL, head), qs), -1)
            return block.transpose(1, 2).reshape(-1, k // 32 * (head + 32))
        chunks = groups[..., PANEL * head :].reshape(-1, k // 32, 8, PANEL, 2)  # [.., c, r, e]
        low, high = chunks & 15, chunks >> 4
        # [.., c, low / high, r, e] -> [.., r, c, low / high, e]: weight 4 c + 2 (low / high) + e
        q = torch.stack((low, high), 3).permute(0, 1, 4, 2, 3, 5).reshape(-1, k // 32, PANEL, 32)
        qs = q[..., :16] | (q[..., 16:] << 4)  # ggml's order: byte i holds weights i and i + 16
        block = torch.cat((header.reshape(p, k // 32, PANEL, head), qs), -1)
        return block.transpose(1, 2).reshape(-1, k // 32 * (head + 16))

    def dequantize_rows(self, first: int, last: int) -> torch.Tensor:
        """W[first:last] as float32 [last - first, k], exactly gguf-py's decoding of the source blocks
        (packed: row_packed's decoding of the source rows)."""
        if self.groups is not None:
            return self.groups.decode(self.blocks(first, last), first, last)
        return dequantize(self.blocks(first, last), self.qtype)


@cache
def q8_0_row_bytes(k: int) -> torch.Tensor:
    """[16, k / 32 * 34] int64: where row r's GGUF bytes sit in its Q8_0 panel (d, then weights 2 c + e)."""
    r = torch.arange(PANEL).view(PANEL, 1, 1)
    group = torch.arange(k // 32).view(1, -1, 1) * PANEL * 34  # a panel-block's first byte
    d = 2 * r + torch.arange(2).view(1, 1, 2)
    c, e = torch.arange(16).view(1, 1, 16, 1), torch.arange(2).view(1, 1, 1, 2)
    q = (PANEL * 2 + 32 * c + 2 * r.unsqueeze(-1) + e).reshape(PANEL, 1, 32)
    return torch.cat((group + d, group + q), -1).reshape(PANEL, -1)


def can_interleave(part: object) -> TypeGuard[QuantizedWeight | RowPacked]:
    """Whether part takes this layout (read when a model loads); PLAYGROUND_INTERLEAVED_PACKED=0 keeps
    packed integers in packed_rows' row layout (A/B runs)."""
    if isinstance(part, RowPacked):
        enabled = os.environ.get("PLAYGROUND_INTERLEAVED_PACKED", "1") != "0"
        return enabled and part.shape[0] % PANEL == 0 and group_scales(part) is not None
    return (
        isinstance(part, QuantizedWeight)
        and part.qtype in TYPES
        and part.shape[0] % PANEL == 0
        and part.shape[1] % 32 == 0
        and part.data.device.type == "cpu"
    )


def interleave(part: QuantizedWeight | RowPacked) -> Interleaved:
    """part's blocks (or packed rows) in the interleaved layout (the same bytes, moved)."""
    if isinstance(part, RowPacked):
        groups = group_scales(part)
        assert groups is not None, "can_interleave(part) first"
        data = _move(part.qweight, groups.qtype, part.shape)
        if groups.qtype == "w8":
            data ^= 0x80  # int8 q - 128 (group_scales)
        return Interleaved(groups.qtype, data, part.shape, groups)
    return Interleaved(part.qtype, _move(part.data, part.qtype, part.shape), part.shape)


def _move(rows: torch.Tensor, qtype: str, shape: tuple[int, int]) -> torch.Tensor:
    """rows [n, k / 32 * block bytes] (GGUF blocks, or packed chunks) -> the panels [n / 16, panel bytes]."""
    head = HEAD[qtype]
    n, k = shape
    blocks = rows.reshape(n // PANEL, PANEL, k // 32, -1).transpose(1, 2)  # [panels, b, r, bytes]
    header = blocks[..., :head].reshape(n // PANEL, k // 32, PANEL, head // 2, 2).transpose(2, 3)
    qs = blocks[..., head:]
    if qtype in EIGHT_BIT:  # [.., r, c, e] -> [.., c, r, e]
        chunks = qs.reshape(n // PANEL, k // 32, PANEL, 16, 2).transpose(2, 3)
        chunks = chunks.reshape(n // PANEL, k // 32, -1)
        group = torch.cat((header.reshape(n // PANEL, k // 32, PANEL * head), chunks), -1)
        return group.reshape(n // PANEL, -1).contiguous()
    q = torch.cat((qs & 15, qs >> 4), -1).view(n // PANEL, k // 32, PANEL, 8, 2, 2)  # [.., r, c, lh, e]
    chunks = q[..., 0, :] | (q[..., 1, :] << 4)  # [.., r, c, e]: low nibble 4 c + e, high 4 c + 2 + e
    chunks = chunks.permute(0, 1, 3, 2, 4)  # [.., c, r, e]
    chunks = chunks.reshape(n // PANEL, k // 32, -1)
    group = torch.cat((header.reshape(n // PANEL, k // 32, PANEL * head), chunks), -1)
    return group.reshape(n // PANEL, -1).contiguous()


def join_parts(parts: list) -> list:
    """Neighbouring packed interleaved parts that group_scales.join can stack joined into one (panels
    stacked: the same bytes): a fused projection's q, k and v in one kernel call."""
    joined = [parts[0]]
    for part in parts[1:]:
        last = joined[-1]
        both = isinstance(part, Interleaved) and isinstance(last, Interleaved)
        groups = both and last.groups and part.groups and join(last.groups, part.groups)
        if not groups:
            joined.append(part)
            continue
        data = torch.cat((last.data, part.data))
        joined[-1] = Interleaved(part.qtype, data, (last.shape[0] + part.shape[0], part.shape[1]), groups)
    return joined
