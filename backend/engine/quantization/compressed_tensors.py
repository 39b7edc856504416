"""compressed-tensors checkpoints (llm-compressor's output, served by vLLM), read as stored.

Two formats: "pack-quantized" (W4A16 / W8A16 integers, gptq_awq.PackedWeight with method
"compressed-tensors") and "float-quantized" fp8 weights (Fp8Weight: float8_e4m3fn `weight` with a
per-tensor or per-channel `weight_scale`, computed by upcasting a tile at a time). Activation
quantization (input_activations, e.g. W8A8 FP8's input_scale) is not applied: products run in the compute
dtype, as the weight-only schemes do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from backend.engine.quantization.gptq_awq import PackedWeight
from backend.errors import UserError

log = logging.getLogger(__name__)
FORMATS = ("pack-quantized", "float-quantized")


@dataclass(slots=True)
class Fp8Weight:
    weight: torch.Tensor  # [n, k] float8_e4m3fn
    scale: torch.Tensor  # [n, 1] per channel, or one value per tensor
    shape: tuple[int, int]

    row_multiple = 1

    def tensors(self) -> list[torch.Tensor]:
        return [self.weight, self.scale]

    def dequantize_rows(self, first: int, last: int) -> torch.Tensor:
        scale = self.scale.float().reshape(-1, 1)
        if scale.shape[0] > 1:
            scale = scale[first:last]
        return self.weight[first:last].float() * scale


def weight_args(config: dict[str, Any]) -> dict[str, Any]:
    """The `weights` arguments shared by every config group; UserError when groups differ or are absent."""
    groups = config.get("config_groups") or {}
    args = [group.get("weights") for group in groups.values()]
    if not args or any(a is None or a != args[0] for a in args):
        raise UserError("compressed-tensors: every config group must quantize weights the same way here")
    return args[0]


def check_format(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    fmt = config.get("format")
    if fmt not in FORMATS:
        raise UserError(
            f"compressed-tensors format {fmt!r} is not supported; supported: {', '.join(FORMATS)}"
        )
    args = weight_args(config)
    if fmt == "float-quantized" and (args.get("type") != "float" or args.get("num_bits") != 8):
        raise UserError(f"float-quantized weights must be fp8 (type float, 8 bits), got {args}")
    if fmt == "pack-quantized" and args.get("num_bits") not in (4, 8):
        raise UserError(f"pack-quantized weights must have 4 or 8 bits here, got {args.get('num_bits')!r}")
    if args.get("strategy") not in ("tensor", "channel", "group"):
        raise UserError(
            f"weight strategy {args.get('strategy')!r} is not supported; use tensor, channel or group"
        )
    return fmt, args


def take_compressed(state: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, Any]:
    """The quantized linears of state (removed from it) by their dense weight's name."""
    fmt, args = check_format(config)
    parts: dict[str, Any] = {}
    if fmt == "float-quantized":
        for name in [n for n in state if n.endswith(".weight_scale")]:
            prefix = name.removesuffix("_scale")  # "...q_proj.weight"
            weight, scale = state.pop(prefix), state.pop(name)
            if state.pop(prefix.removesuffix("weight") + "input_scale", None) is not None:
                log.warning("%s: static activation scale ignored (weights are upcast)", prefix)
            parts[prefix] = Fp8Weight(weight, scale, (weight.shape[0], weight.shape[1]))
        return parts
    bits = int(args["num_bits"])
    for name in [n for n in state if n.endswith(".weight_packed")]:
        prefix = name.removesuffix("_packed")
        packed, scale = state.pop(name), state.pop(f"{prefix}_scale")
        n, k = (int(d) for d in state.pop(f"{prefix}_shape").tolist())
        zeros = state.pop(f"{prefix}_zero_point", torch.zeros(0, dtype=torch.int32))
        g_idx = state.pop(f"{prefix}_g_idx", None)
        stored = g_idx is not None
        if g_idx is None:
            group = k if args["strategy"] != "group" else int(args["group_size"])
            g_idx = torch.arange(k) // group
        parts[prefix] = PackedWeight("compressed-tensors", bits, packed, zeros, scale, g_idx, (n, k), stored)
    return parts
