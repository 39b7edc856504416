"""MXFP4 weights (OCP Microscaling: 32 e2m1 values sharing one e8m0 scale), gpt-oss's expert format, kept as
stored: as GGUF's block_mxfp4 (17 bytes a block: the scale byte e, then 16 bytes, byte j holding value j in
its low nibble and value j + 16 in its high one), the layout GGUF files hold and csrc/mxfp4.h reads.

gpt-oss checkpoints store `*_blocks` [.., n, k / 32, 16] (byte j: value 2 j low, 2 j + 1 high) and `*_scales`
[.., n, k / 32]; from_gpt_oss moves those bytes into GGUF's blocks, nothing rounded. A value decodes to
ggml's doubled e2m1 value times 2^(e - 128) (KVALUES, gguf-py's dequantize and csrc/mxfp4.h), which for
every scale but the reserved e = 255 is transformers' FP4_VALUES[nibble] * 2^(e - 127)
(integrations/mxfp4.py; its -0.0 for code 8 is +0.0 here, as in ggml): dequantize computes it in fp32,
exactly.

interleave() lays the blocks out in csrc/interleaved.cpp's 16-row panels (interleaved.Interleaved, qtype
"mxfp4"): per panel-block the 16 rows' scale bytes, then 8 chunks of 32 bytes as Q4_0's (chunk c's byte
2 r + e: row r's value 4 c + e in its low nibble, 4 c + 2 + e in its high one), the same bytes moved.
"""

from __future__ import annotations

import torch

from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.interleaved import PANEL, Interleaved

QTYPE = "mxfp4"
BLOCK, BLOCK_BYTES = 32, 17  # values a block, bytes a block (gguf GGML_QUANT_SIZES[MXFP4])
PANEL_BLOCK_BYTES = PANEL + PANEL * 16  # 16 scale bytes, 8 chunks of 32 bytes
# e2m1 codes 0-15 doubled (ggml's kvalues_mxfp4, gguf-py's MXFP4.kvalues: int8, so code 8, e2m1's -0, is +0)
KVALUES = (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0)


def from_gpt_oss(blocks: torch.Tensor, scales: torch.Tensor) -> QuantizedWeight:
    """gpt-oss's *_blocks [E, n, k / 32, 16] and *_scales [E, n, k / 32] (uint8) as one QuantizedWeight of
    the experts stacked on rows: data [E * n, k / 32 * 17] in GGUF's block layout, shape (E * n, k)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks [.., n, k / 32, 16] and scales [.., n, k / 32] must be uint8 and agree, got "
            f"{tuple(blocks.shape)} {blocks.dtype} and {tuple(scales.shape)} {scales.dtype}"
        )
    codes = torch.stack((blocks & 15, blocks >> 4), -1).flatten(-2)  # [.., G, 32]: value order
    qs = codes[..., :16] | (codes[..., 16:] << 4)  # GGUF's order: byte j holds values j and j + 16
    data = torch.cat((scales.unsqueeze(-1), qs), -1)  # [.., n, G, 17]
    rows, groups = data.shape[:-2].numel(), data.shape[-2]
    return QuantizedWeight(
        QTYPE, data.reshape(rows, groups * BLOCK_BYTES).contiguous(), (rows, groups * BLOCK)
    )


def codes_and_scales(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF blocks [n, G * 17] -> (codes [n, G, 32] in value order, scale bytes [n, G])."""
    blocks = data.reshape(data.shape[0], -1, BLOCK_BYTES)
    qs = blocks[..., 1:]
    return torch.cat((qs & 15, qs >> 4), -1), blocks[..., 0]


def decode(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes [n, G, 32] and scale bytes [n, G] -> [n, G * 32] float32: KVALUES[code] * 2^(e - 128)."""
    table = torch.tensor(KVALUES, dtype=torch.float32, device=codes.device)
    values = torch.ldexp(table[codes.long()], scales.int().unsqueeze(-1) - 128)
    return values.reshape(codes.shape[0], -1)


def dequantize(data: torch.Tensor) -> torch.Tensor:
    """GGUF MXFP4 blocks [n, k / 32 * 17] -> [n, k] float32, exactly (gguf-py's values)."""
    return decode(*codes_and_scales(data))


def interleave(weight: QuantizedWeight) -> Interleaved:
    """weight's blocks in csrc/interleaved.cpp's 16-row panels (n a multiple of 16)."""
    n, k = weight.shape
    assert weight.qtype == QTYPE and n % PANEL == 0 and k % BLOCK == 0
    codes, scales = codes_and_scales(weight.data)
    panels, groups = n // PANEL, k // BLOCK
    nibbles = codes.view(panels, PANEL, groups, 8, 2, 2)  # [p, r, g, c, low / high, e]: value 4 c + 2 lh + e
    chunks = (nibbles[..., 0, :] | (nibbles[..., 1, :] << 4)).permute(0, 2, 3, 1, 4)  # [p, g, c, r, e]
    head = scales.view(panels, PANEL, groups).transpose(1, 2)  # [p, g, r]
    group = torch.cat((head, chunks.reshape(panels, groups, -1)), -1)
    return Interleaved(QTYPE, group.reshape(panels, -1).contiguous(), weight.shape)


def deinterleave(part: Interleaved) -> QuantizedWeight:
    """interleave's inverse: the GGUF blocks back, bit for bit."""
    n, k = part.shape
    panels, groups = n // PANEL, k // BLOCK
    group = part.data.view(panels, groups, PANEL_BLOCK_BYTES)
    scales = group[..., :PANEL].transpose(1, 2).reshape(n, groups)
    chunks = group[..., PANEL:].reshape(panels, groups, 8, PANEL, 2).permute(0, 3, 1, 2, 4)  # [p, r, g, c, e]
    nibbles = torch.stack((chunks & 15, chunks >> 4), -2)  # [p, r, g, c, low / high, e]
    codes = nibbles.reshape(n, groups, BLOCK)
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    data = torch.cat((scales.unsqueeze(-1), qs), -1).reshape(n, -1)
    return QuantizedWeight(QTYPE, data.contiguous(), part.shape)


def checkpoint_experts(state: dict[str, torch.Tensor]) -> list[str]:
    """The names (without _blocks) of a gpt-oss checkpoint's MXFP4 expert tensors (quant_method "mxfp4")."""
    return sorted(name.removesuffix("_blocks") for name in state if name.endswith("_proj_blocks"))


def dequantize_checkpoint(state: dict[str, torch.Tensor]) -> None:
    """Replace each <proj>_blocks [E, n, k / 32, 16] / <proj>_scales pair of state by the dense <proj>
    [E, k, n] fp32 that transformers' Mxfp4 loader dequantizes to (convert_moe_packed_tensors: its
    in-memory and save_pretrained layout), exactly."""
    for name in checkpoint_experts(state):
        blocks, scales = state.pop(f"{name}_blocks"), state.pop(f"{name}_scales")
        experts, n = blocks.shape[:2]
        dense = dequantize(from_gpt_oss(blocks, scales).data).view(experts, n, -1)
        state[name] = dense.transpose(1, 2).contiguous()
