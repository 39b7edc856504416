"""GGUF block types the engine keeps quantized, and their decoding in plain PyTorch.

A quantized [n, k] matrix is stored as n rows of k / block_size blocks (ggml-common.h layouts). The
PyTorch decoding here is the always-correct path (CUDA, PLAYGROUND_CPU_KERNELS=0, no compiler); it
computes what gguf-py's dequantize_blocks computes, step for step, and the CPU kernels
(csrc/quantized.cpp) decode the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

KEPT_TYPES = {  # GGUF type -> the kernel's name for it (cpu_kernels.QUANT_TYPES)
    GGMLQuantizationType.Q4_0: "q4_0",
    GGMLQuantizationType.Q4_1: "q4_1",
    GGMLQuantizationType.Q8_0: "q8_0",
    GGMLQuantizationType.Q4_K: "q4_k",
    GGMLQuantizationType.Q6_K: "q6_k",
}
# what the GGUF reader keeps as blocks: the kernels' types, and MXFP4 (GGML type 39, gpt-oss's experts),
# decoded by _mxfp4 below until the MoE kernels read it
STORED_TYPES = KEPT_TYPES | {GGMLQuantizationType.MXFP4: "mxfp4"}
# ggml-common.h kvalues_mxfp4: the E2M1 values doubled (0.5 -> 1), so the block scale is 2^(e - 128)
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def block_shape(qtype: str) -> tuple[int, int]:
    """(weights per block, bytes per block) of a stored type."""
    (gguf_type,) = (t for t, name in STORED_TYPES.items() if name == qtype)
    return GGML_QUANT_SIZES[gguf_type]


def _half(b: torch.Tensor) -> torch.Tensor:  # [N, 2] uint8 -> [N, 1] float32
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """qs [N, B] -> [N, B / group, 2, group]: low nibbles of each group of bytes, then high ones."""
    grouped = qs.reshape(qs.shape[0], -1, 1, group)
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=qs.device).view(1, 1, 2, 1)
    return (grouped >> shifts) & 15


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 2:], 16).reshape(b.shape[0], 32).to(torch.int8) - 8
    return _half(b[:, :2]) * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 4:], 16).reshape(b.shape[0], 32).float()
    return _half(b[:, :2]) * q + _half(b[:, 2:4])


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _half(b[:, :2])


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    s = b[:, 4:16].int()
    scale = torch.cat((s[:, :4] & 63, (s[:, 8:] & 15) | ((s[:, :4] >> 6) << 4)), 1).float()
    low = torch.cat((s[:, 4:8] & 63, (s[:, 8:] >> 4) | ((s[:, 4:8] >> 6) << 4)), 1).float()
    d = (_half(b[:, :2]) * scale).view(n, 8, 1)
    dm = (_half(b[:, 2:4]) * low).view(n, 8, 1)
    q = _nibbles(b[:, 16:], 32).reshape(n, 8, 32).float()
    return (d * q - dm).reshape(n, 256)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = (_half(b[:, 208:210]) * b[:, 192:208].contiguous().view(torch.int8).float()).view(n, 16, 1)
    low = _nibbles(b[:, :128], 64).reshape(n, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4, 1)
    high = ((b[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 8, 32)
    q = (low | (high << 4)).to(torch.int8) - 32
    return (d * q.reshape(n, 16, 16).float()).reshape(n, 256)


def _mxfp4(b: torch.Tensor) -> torch.Tensor:
    """block_mxfp4 (17 bytes): e (E8M0 exponent), then qs[16]: weight j in the low nibble of qs[j], weight
    j + 16 in its high nibble; weight = MXFP4_VALUES[nibble] * 2^(e - 128) (ggml's dequantize_row_mxfp4)."""
    values = torch.tensor(MXFP4_VALUES, dtype=torch.float32, device=b.device)
    q = _nibbles(b[:, 1:], 16).reshape(b.shape[0], 32).long()
    scale = torch.ldexp(torch.ones(b.shape[0], 1, device=b.device), b[:, :1].int() - 128)
    return values[q] * scale


DECODERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "q4_0": _q4_0,
    "q4_1": _q4_1,
    "q8_0": _q8_0,
    "q4_k": _q4_k,
    "q6_k": _q6_k,
    "mxfp4": _mxfp4,
}


def dequantize(data: torch.Tensor, qtype: str) -> torch.Tensor:
    """data [n, row_bytes] uint8 (GGUF blocks) -> [n, k] float32."""
    _, type_size = block_shape(qtype)
    n = data.shape[0]
    blocks = data.reshape(n * (data.shape[1] // type_size), type_size)
    return DECODERS[qtype](blocks).reshape(n, -1)
