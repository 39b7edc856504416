"""GPTQ, AWQ (GEMM) and compressed-tensors pack-quantized checkpoints: integer weights packed into int32,
read as stored.

GPTQ (AutoGPTQ / GPTQModel `pack`, checkpoint_format "gptq"; vLLM's gptq_pack): qweight [k / f, n] packs f =
32 / bits input rows per int32 (row r * f + i at bits i * bits); qzeros [groups, n / f] packs output columns
the same way and stores zero - 1; scales [groups, n] fp16; g_idx [k] the group of each input row (i //
group_size, or any order with desc_act). AWQ GEMM (AutoAWQ `WQLinear_GEMM`; vLLM's awq_pack): qweight
[k, n / 8] and qzeros [groups, n / 8] pack 8 output columns per int32 in the order 0 2 4 6 1 3 5 7, zeros
stored as they are; scales [groups, n]; group of row i = i // group_size.
compressed-tensors "pack-quantized" (llm-compressor; compressed_tensors' pack_to_int32): weight_packed
[n, k / f] packs input columns of each output row (column c * f + i at bits i * bits), values stored as
q + 2^(bits-1); weight_zero_point (asymmetric only) [n / f, groups] packs output rows the same way and
offset; weight_scale [n, groups]; weight_g_idx [k] with actorder. All dequantize to
W[n, k] = (q - zero) * scale. A part is decoded a tile of output rows at a time, in PyTorch, into
QuantizedLinear's scratch buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from backend.errors import UserError

METHODS = ("gptq", "awq", "compressed-tensors")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's packing order of 8 columns into an int32
PACKED_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")


@dataclass(slots=True)
class PackedWeight:
    method: str  # "gptq" | "awq" | "compressed-tensors"
    bits: int
    qweight: torch.Tensor  # int32, see the module docstring for each method's layout
    qzeros: torch.Tensor  # int32
    scales: torch.Tensor  # [groups, n] fp16 or bf16
    g_idx: torch.Tensor  # [k] int: the group of each input row
    shape: tuple[int, int]  # (n, k) of the weight it encodes
    g_idx_stored: bool = True  # read from the checkpoint (else built from group_size: not counted as stored)

    @property
    def row_multiple(self) -> int:
        """Output rows come in packs of this many: tiles start at multiples of it."""
        return 32 // self.bits

    def tensors(self) -> list[torch.Tensor]:
        """The checkpoint's tensors (what the layer holds as buffers and weights_bytes counts)."""
        return [self.qweight, self.qzeros, self.scales] + ([self.g_idx] if self.g_idx_stored else [])

    def dequantize_rows(self, first: int, last: int) -> torch.Tensor:
        """W[first:last] as float32 [last - first, k]; first a multiple of row_multiple."""
        f = self.row_multiple
        assert first % f == 0, "tiles start at a pack boundary"
        cols = slice(first // f, -(-last // f))
        if self.method == "compressed-tensors":
            return self.dequantize_compressed(first, last)
        if self.method == "gptq":
            q = unpack_rows(self.qweight[:, first:last], self.bits)  # [k, last - first]
            zeros = unpack_columns(self.qzeros[:, cols], self.bits, None)[:, : last - first] + 1
        else:
            q = unpack_columns(self.qweight[:, cols], self.bits, AWQ_ORDER)[:, : last - first]
            zeros = unpack_columns(self.qzeros[:, cols], self.bits, AWQ_ORDER)[:, : last - first]
        scales = self.scales[:, first:last].float()
        w = (q - zeros[self.g_idx]).float() * scales[self.g_idx]  # [k, rows]
        return w.t()

    def dequantize_compressed(self, first: int, last: int) -> torch.Tensor:
        offset = 1 << (self.bits - 1)
        q = unpack_columns(self.qweight[first:last], self.bits, None)[:, : self.shape[1]] - offset
        scales = self.scales[first:last].float()  # [rows, groups]
        if self.qzeros.numel():
            f = self.row_multiple
            zeros = unpack_rows(self.qzeros[first // f : -(-last // f)], self.bits)[: last - first] - offset
            q = q - zeros[:, self.g_idx]
        return q.float() * scales[:, self.g_idx]


def _shifts(bits: int, device: torch.device) -> torch.Tensor:
    return torch.arange(0, 32, bits, dtype=torch.int32, device=device)


def unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[k / f, n] int32 -> [k, n] int32: row r * f + i from bits i * bits of row r."""
    values = (packed.unsqueeze(1) >> _shifts(bits, packed.device).view(1, -1, 1)) & ((1 << bits) - 1)
    return values.reshape(-1, packed.shape[1])


def unpack_columns(packed: torch.Tensor, bits: int, order: tuple[int, ...] | None) -> torch.Tensor:
    """[m, n / f] int32 -> [m, n] int32: column c * f + order[i] from bits i * bits of column c."""
    values = (packed.unsqueeze(2) >> _shifts(bits, packed.device)) & ((1 << bits) - 1)  # [m, n / f, f]
    if order is not None:
        values = values[..., torch.tensor(order).argsort()]
    return values.reshape(packed.shape[0], -1)


def check_config(config: dict[str, Any]) -> tuple[str, int, int]:
    """(method, bits, group_size) of a GPTQ/AWQ quantization_config; UserError for what is not supported."""
    method = config.get("quant_method")
    bits, group_size = (
        config.get("bits", config.get("w_bit")),
        config.get("group_size", config.get("q_group_size")),
    )
    if method not in METHODS:
        raise UserError(f"quant_method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "gptq" and config.get("checkpoint_format", "gptq") != "gptq":
        raise UserError(
            f"GPTQ checkpoint_format {config['checkpoint_format']!r} is not supported; use 'gptq'"
        )
    if method == "gptq" and bits not in (4, 8):
        raise UserError(f"GPTQ bits must be 4 or 8 here, got {bits!r}")
    if method == "awq" and (bits != 4 or str(config.get("version", "gemm")).lower() != "gemm"):
        raise UserError(f"AWQ must be 4-bit GEMM here, got bits={bits!r} version={config.get('version')!r}")
    if not isinstance(group_size, int) or (group_size != -1 and group_size < 1):
        raise UserError(f"group_size must be -1 or a positive integer, got {group_size!r}")
    assert isinstance(bits, int), "checked above"
    return str(method), bits, group_size


def take_packed(state: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, PackedWeight]:
    """The packed linears of state (removed from it), by their dense weight's name ("...q_proj.weight")."""
    method, bits, group_size = check_config(config)
    prefixes = [name.removesuffix(".qweight") for name in state if name.endswith(".qweight")]
    packed: dict[str, PackedWeight] = {}
    for prefix in prefixes:
        qweight, qzeros, scales = (state.pop(f"{prefix}.{s}") for s in PACKED_SUFFIXES[:3])
        n = scales.shape[1]
        k = qweight.shape[0] * (32 // bits) if method == "gptq" else qweight.shape[0]
        g_idx = state.pop(f"{prefix}.g_idx", None)
        stored = g_idx is not None and method == "gptq"
        if g_idx is None or not stored:
            g_idx = torch.arange(k) // (k if group_size == -1 else group_size)
        packed[f"{prefix}.weight"] = PackedWeight(
            method, bits, qweight, qzeros, scales, g_idx, (n, k), stored
        )
    return packed
