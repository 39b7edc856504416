"""Layers over quantized weights (install.py puts them into a model in place of its dense ones): GGUF
blocks, GPTQ / AWQ / compressed-tensors packed integers (gptq_awq.PackedWeight) and fp8 weights
(compressed_tensors.Fp8Weight); on the CPU the last two are re-laid out at load (row_packed.RowPacked, the
same bytes) for the packed_rows kernels. Small batches use the fused decode + GEMV kernels. In bf16 where the
kernels' build has AVX512_BF16, GGUF Q4_0 / Q4_1 / Q8_0 and packed 4- and 8-bit integers are moved once
more into csrc/interleaved.cpp's 16-row panels (interleaved.Interleaved): one kernel at every batch size.
Where the kernels' build has AVX2 and no AVX-512, GGUF Q4_0 parts are moved into 8-column tiles
(column_tiles.ColumnTiles): csrc/quantized.cpp q4_0x8_gemm (int8_avx2.h) up to cpu_kernels.INT8_MAX_ROWS rows.

QuantizedLinear computes x @ W^T from W's blocks: batches of up to cpu_kernels.QUANT_GEMV_MAX_ROWS rows go
through the fused decode + matrix-vector kernel (each block read once, decoded in cache); in bf16, where
the kernels' build has AVX512_BF16, Q4_0 / Q4_1 / Q8_0 layers take batches of up to
cpu_kernels.quant_gemm_max_rows() rows through the fused quant_gemm (the same function: the weights'
integers times bf16 x, summed in fp32, then scaled per block), and Q6_K layers (llama-quantize's
output matrix) up to cpu_kernels.Q6_K_GEMM_MAX_ROWS in fp32 or bf16 on every build (csrc/q6_k_gemm.cpp);
larger batches decode W a tile of rows at a time into a scratch buffer shared by all layers (natively)
and multiply the tile with torch's GEMM (in bf16, the weights rounded to bf16). Without the kernels
(CUDA, PLAYGROUND_CPU_KERNELS=0, no compiler) tiles are decoded in PyTorch (gguf_blocks, the parts'
dequantize_rows). A fused projection (q/k/v, gate/up) holds one part per checkpoint tensor, so parts of
different types (Q4_K q with Q6_K v) stay as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from backend.engine import cpu_kernels
from backend.engine.device import cpu_has_fast_bf16
from backend.engine.quantization import column_tiles
from backend.engine.quantization.column_tiles import ColumnTiles
from backend.engine.quantization.compressed_tensors import Fp8Weight
from backend.engine.quantization.gguf_blocks import dequantize
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.gptq_awq import PackedWeight
from backend.engine.quantization.interleaved import Interleaved, can_interleave, interleave, join_parts
from backend.engine.quantization.row_packed import RowPacked, relayout

Part = QuantizedWeight | PackedWeight | Fp8Weight | RowPacked | Interleaved | ColumnTiles
PACKED_SLICED_MAX_ROWS = 64  # RowPacked layers: packed_gemv in slices up to here (measured 1.5-2.6x tiles)
TILE_WEIGHTS = 1 << 20  # weights decoded per GEMM call: 2-4 MB, about an L2 cache


class Scratch:
    """One reusable decode buffer per (dtype, device) for all the layers of a model."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    def get(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        buffer = self.buffers.get((dtype, device))
        if buffer is None or buffer.numel() < numel:
            buffer = self.buffers[(dtype, device)] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel]


def decode_blocks(data: torch.Tensor, qtype: str, out: torch.Tensor, use_kernel: bool) -> torch.Tensor:
    """GGUF blocks data [r, row_bytes] decoded into out [r, k]."""
    if use_kernel:
        return cpu_kernels.quant_dequant(data, qtype, out)
    return out.copy_(dequantize(data, qtype))


def decode_rows(part: Part, first: int, last: int, out: torch.Tensor, use_kernel: bool) -> torch.Tensor:
    """Rows first..last-1 of part decoded into out [last - first, k]."""
    if isinstance(part, RowPacked) and use_kernel:
        return cpu_kernels.packed_dequant(part, first, last, out)
    if isinstance(part, ColumnTiles) and use_kernel:
        return cpu_kernels.column_tiles_dequant(part, first, last, out)
    if not isinstance(part, QuantizedWeight):
        return out.copy_(part.dequantize_rows(first, last))  # Interleaved: only where kernels are off
    return decode_blocks(part.data[first:last], part.qtype, out, use_kernel)


def dequantize_part(part: Part) -> torch.Tensor:
    """The whole weight [n, k] in float32 (for the dense path)."""
    if not isinstance(part, QuantizedWeight):
        return part.dequantize_rows(0, part.shape[0])
    return dequantize(part.data, part.qtype)


def part_tensors(part: Part) -> list[torch.Tensor]:
    return [part.data] if isinstance(part, QuantizedWeight) else part.tensors()


def merge_same_type(parts: list[Part]) -> list[Part]:
    """Neighbouring GGUF parts of one type joined into one (rows are whole blocks): fewer kernel calls."""
    merged = [parts[0]]
    for part in parts[1:]:
        last = merged[-1]
        if not (isinstance(part, QuantizedWeight) and isinstance(last, QuantizedWeight)) or (
            part.qtype != last.qtype
        ):
            merged.append(part)
            continue
        data = torch.cat((last.data, part.data))
        merged[-1] = QuantizedWeight(part.qtype, data, (last.shape[0] + part.shape[0], part.shape[1]))
    return merged


def interleaves(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether GGUF Q4_0 / Q4_1 / Q8_0 and packed 4- / 8-bit parts take csrc/interleaved.cpp's layout (CPU
    kernels, bf16, AVX512_BF16)."""
    return (
        dtype == torch.bfloat16
        and cpu_kernels.supports(device, dtype)
        and cpu_kernels.interleaved_available()
    )


def takes_column_tiles(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether GGUF Q4_0 parts take column_tiles' layout (CPU kernels with AVX2's int8 tiles)."""
    return cpu_kernels.supports(device, dtype) and cpu_kernels.column_tiles_available()


class QuantizedLinear(nn.Module):
    use_kernel = False  # set by CausalLM.prepare_weights when cpu_kernels serve this model
    float_output = False  # an interleaved lm_head: the kernel writes the logits' fp32 copy (llama.Linear's)

    def __init__(self, parts: list[Part], bias: bool, scratch: Scratch, dtype: torch.dtype) -> None:
        super().__init__()
        assert len({p.shape[1] for p in parts}) == 1, "fused parts share the input size"
        parts = [relayout(p) for p in parts]  # packed ints and fp8 on the CPU: the kernels' row layout
        parts = merge_same_type(parts)
        device = part_tensors(parts[0])[0].device
        if interleaves(device, dtype):
            parts = join_parts([interleave(p) if can_interleave(p) else p for p in parts])  # bytes moved
        elif takes_column_tiles(device, dtype):
            parts = [column_tiles.tile(p) if column_tiles.can_tile(p) else p for p in parts]  # bytes moved
        self.parts = parts
        self.has_gemv = all(
            isinstance(p, QuantizedWeight | RowPacked | Interleaved | ColumnTiles) for p in parts
        )
        self.all_packed = all(isinstance(p, RowPacked) for p in parts)
        self.all_interleaved = all(isinstance(p, Interleaved) for p in parts)  # any batch: one kernel
        tensors = [t for part in parts for t in part_tensors(part)]
        for i, tensor in enumerate(tensors):
            self.register_buffer(f"qweight_{i}", tensor)  # counted by weights_bytes, moved by .to()
        # the kernels for 9-64 rows: GGUF blocks of Q4_0 / Q4_1 / Q8_0 (bf16 activations) or Q6_K (gemm_rows)
        self.gemm_types = {p.qtype for p in parts if isinstance(p, QuantizedWeight)}
        self.has_tiles = any(isinstance(p, ColumnTiles) for p in parts)
        self.has_gemm = all(isinstance(p, Interleaved | QuantizedWeight | ColumnTiles) for p in parts)
        self.in_features = parts[0].shape[1]
        self.out_features = sum(p.shape[0] for p in parts)
        device = tensors[0].device
        self.bias = nn.Parameter(torch.zeros(self.out_features, dtype=dtype, device=device)) if bias else None
        self.scratch = scratch

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [rows, in_features]
        rows = x.shape[0]
        if rows == 0:  # an lm_head in a step whose prefill chunks end no prompt: the kernels need rows
            return x.new_empty(0, self.out_features, dtype=torch.float32 if self.float_output else x.dtype)
        if self.use_kernel and self.all_interleaved and x.is_contiguous():
            if len(self.parts) == 1:  # the decode hot path: one call, nothing sliced
                dtype = torch.float32 if self.float_output else x.dtype
                out = x.new_empty(rows, self.out_features, dtype=dtype)
                cpu_kernels.interleaved_gemm(x, self.parts[0], self.bias, out)
                return out
            return self.fused(x, cpu_kernels.quant_gemm)
        if (
            self.use_kernel
            and self.has_gemv
            and rows <= cpu_kernels.QUANT_GEMV_MAX_ROWS
            and x.is_contiguous()
        ):
            return self.fused(x, cpu_kernels.quant_gemv)
        if self.use_kernel and self.has_gemm and rows <= self.gemm_rows(x.dtype) and x.is_contiguous():
            return self.fused(x, cpu_kernels.quant_gemm)
        if self.use_kernel and self.all_packed and rows <= PACKED_SLICED_MAX_ROWS and x.is_contiguous():
            return self.sliced(x)
        return self.tiled_matmul(x)

    def gemm_rows(self, dtype: torch.dtype) -> int:
        """The most rows quant_gemm (column tiles: column_tiles_gemm) takes for every GGUF part with
        activations of dtype (0: none)."""
        limits = [cpu_kernels.quant_gemm_rows(t, dtype) for t in self.gemm_types]
        return min(limits + [cpu_kernels.INT8_MAX_ROWS] * self.has_tiles, default=0)

    def sliced(self, x: torch.Tensor) -> torch.Tensor:
        """packed_gemv over slices of QUANT_GEMV_MAX_ROWS rows: re-reading the packed weights per slice costs
        less than decoding them into tiles for torch's GEMM up to PACKED_SLICED_MAX_ROWS rows."""
        out = x.new_empty(x.shape[0], self.out_features)
        step = cpu_kernels.QUANT_GEMV_MAX_ROWS
        for first in range(0, x.shape[0], step):
            self.fused(x[first : first + step], cpu_kernels.quant_gemv, out[first : first + step])
        return out

    def fused(self, x: torch.Tensor, kernel, out: torch.Tensor | None = None) -> torch.Tensor:
        """Every part through a decode + multiply kernel (quant_gemv or quant_gemm), into one output."""
        out = x.new_empty(x.shape[0], self.out_features) if out is None else out
        start = 0
        for part in self.parts:
            stop = start + part.shape[0]
            bias = None if self.bias is None else self.bias[start:stop]
            if isinstance(part, Interleaved):
                cpu_kernels.interleaved_gemm(x, part, bias, out[:, start:stop])
            elif isinstance(part, ColumnTiles):  # any rows up to INT8_MAX_ROWS (gemm_rows)
                cpu_kernels.column_tiles_gemm(x, part, bias, out[:, start:stop])
            elif isinstance(part, QuantizedWeight) and part.qtype == "q6_k":  # its own row split, any rows
                cpu_kernels.quant_gemm(x, part.data, part.qtype, bias, out[:, start:stop])
            elif isinstance(part, QuantizedWeight):
                kernel(x, part.data, part.qtype, bias, out[:, start:stop])
            else:
                cpu_kernels.packed_gemv(x, part, bias, out[:, start:stop])
            start = stop
        return out

    def tiled_matmul(self, x: torch.Tensor) -> torch.Tensor:
        fast = x.device.type == "cuda" or x.dtype == torch.float32 or cpu_has_fast_bf16()
        compute = x if fast else x.float()  # bf16 GEMMs without bf16 units: fp32 (see llama.Linear)
        out = compute.new_empty(x.shape[0], self.out_features)
        tile_rows = max(32, TILE_WEIGHTS // self.in_features // 32 * 32)  # a multiple of any row_multiple
        start = 0
        for part in self.parts:
            for first in range(0, part.shape[0], tile_rows):
                last = min(first + tile_rows, part.shape[0])
                buffer = self.scratch.get((last - first) * self.in_features, compute.dtype, x.device)
                tile = decode_rows(part, first, last, buffer.view(last - first, -1), self.use_kernel)
                torch.mm(compute, tile.t(), out=out[:, start + first : start + last])
            start += part.shape[0]
        if self.bias is not None:
            out += self.bias
        return out.to(x.dtype)


class QuantizedEmbedding(nn.Module):
    """An embedding over GGUF blocks; a tied one shares its lm_head's part (interleaved or not)."""

    use_kernel = False

    def __init__(self, weight: QuantizedWeight | Interleaved | ColumnTiles, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight_q = weight
        self.register_buffer("qweight", weight.data)
        self.dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, hidden]
        weight = self.weight_q
        if (
            isinstance(weight, Interleaved)
            and weight.qtype == "q8_0"
            and self.use_kernel
            and self.dtype == torch.bfloat16
        ):
            out = torch.empty(input_ids.shape[0], weight.shape[1], dtype=self.dtype, device=input_ids.device)
            return cpu_kernels.interleaved_embedding_q8_0(input_ids.contiguous(), weight, out)  # one call
        if isinstance(weight, Interleaved | ColumnTiles):
            rows = weight.gather(input_ids)
        else:
            rows = weight.data.index_select(0, input_ids)
        out = torch.empty(rows.shape[0], weight.shape[1], dtype=self.dtype, device=rows.device)
        return decode_blocks(rows, weight.qtype, out, self.use_kernel)
