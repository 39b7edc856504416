"""GGUF Q4_0 weights re-laid out at load in tiles of 8 output columns (W's rows), the layout of
csrc/quantized.cpp's q4_0x8_gemm (csrc/int8_avx2.h) on CPUs with AVX2 and no AVX-512 (llama.cpp repacks
Q4_0 the same way there, block_q4_0x8), in the same bytes.

W's rows go in groups of 8; a group's blocks of 32 weights stay in k order, and each group-block (144
bytes) holds the 8 rows' fp16 d, then 4 vectors of 32 bytes: vector v's 4 bytes at 4 c are row c's
quant bytes 4 v .. 4 v + 3 (weights 4 v + e in their low nibbles, 16 + 4 v + e in their high ones). The
kernel reads a group as one stream from memory, each block with 4 loads and no shuffles, where blocks as
stored took 8 streams or a transposition per block. The re-layout only moves bytes, so blocks() gives the
GGUF blocks back bit for bit (decoding, embedding lookups and the tests' reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard

import torch

from backend.engine.quantization.gguf_blocks import dequantize
from backend.engine.quantization.gguf_reader import QuantizedWeight

COLUMNS = 8  # rows of W a tile (csrc/int8_avx2.h TILE_COLUMNS)
BLOCK_BYTES = 18  # a Q4_0 block: fp16 d, 16 bytes of nibbles


@dataclass(slots=True)
class ColumnTiles:
    qtype: str  # "q4_0"
    data: torch.Tensor  # [n / 8, k / 32 * 144] uint8
    shape: tuple[int, int]  # (n, k)

    row_multiple = COLUMNS

    def tensors(self) -> list[torch.Tensor]:
        return [self.data]

    def blocks(self, first: int, last: int) -> torch.Tensor:
        """Rows first..last-1 back in GGUF's block layout [last - first, row bytes]."""
        rows = untile(self.data[first // COLUMNS : -(-last // COLUMNS)], self.shape[1])
        return rows[first % COLUMNS : first % COLUMNS + last - first]

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ids [T] (int64) in GGUF's block layout [T, row bytes] (an embedding lookup)."""
        rows = untile(self.data.index_select(0, ids // COLUMNS), self.shape[1]).view(
            ids.shape[0], COLUMNS, -1
        )
        return rows[torch.arange(ids.shape[0], device=ids.device), ids % COLUMNS]

    def dequantize_rows(self, first: int, last: int) -> torch.Tensor:
        """W[first:last] as float32 [last - first, k], exactly gguf-py's decoding of the source blocks."""
        return dequantize(self.blocks(first, last), self.qtype)


def can_tile(part: object) -> TypeGuard[QuantizedWeight]:
    """Whether part takes this layout: GGUF Q4_0 on the CPU, whole groups of 8 rows."""
    return (
        isinstance(part, QuantizedWeight)
        and part.qtype == "q4_0"
        and part.shape[0] % COLUMNS == 0
        and part.shape[1] % 32 == 0
        and part.data.device.type == "cpu"
    )


def tile(part: QuantizedWeight) -> ColumnTiles:
    """part's blocks in 8-column tiles (the same bytes, moved)."""
    n, k = part.shape
    blocks = part.data.reshape(n // COLUMNS, COLUMNS, k // 32, BLOCK_BYTES).transpose(1, 2)  # [g, b, c, 18]
    d = blocks[..., :2].reshape(n // COLUMNS, k // 32, 2 * COLUMNS)
    quads = blocks[..., 2:].reshape(n // COLUMNS, k // 32, COLUMNS, 4, 4).transpose(2, 3)  # [g, b, v, c, 4]
    group = torch.cat((d, quads.reshape(n // COLUMNS, k // 32, 16 * COLUMNS)), -1)
    return ColumnTiles(part.qtype, group.reshape(n // COLUMNS, -1).contiguous(), part.shape)


def untile(groups: torch.Tensor, k: int) -> torch.Tensor:
    """groups [g, k / 32 * 144] -> their 8 g rows in GGUF's block layout [8 g, k / 32 * 18]."""
    g = groups.shape[0]
    blocks = groups.view(g, k // 32, -1)
    d = blocks[..., : 2 * COLUMNS].reshape(g, k // 32, COLUMNS, 2)
    quads = blocks[..., 2 * COLUMNS :].reshape(g, k // 32, 4, COLUMNS, 4).transpose(2, 3)  # [g, b, c, v, 4]
    rows = torch.cat((d, quads.reshape(g, k // 32, COLUMNS, 16)), -1)  # [g, b, c, 18]
    return rows.transpose(1, 2).reshape(g * COLUMNS, -1)
