"""Checkpoint tensors of a decoder layer's MoE block, by the names they have on disk, into a FusedMoE.

Two spellings reach us (transformers 5.24's save_pretrained writes the Hub's, its conversion_mapping.py
reads both):
  Hub / save_pretrained: per-expert tensors, `block_sparse_moe.experts.N.w1|w3|w2.weight` (Mixtral),
    `mlp.experts.N.gate_proj|up_proj|down_proj.weight` (Qwen2/3-MoE, OLMoE), Granite's stacked
    `block_sparse_moe.input_linear|output_linear.weight` [E, 2 I, H] / [E, H, I] and
    `block_sparse_moe.router.layer.weight`, gpt-oss's `mlp.experts.gate_up_proj_blocks|_scales` (MXFP4) or
    its dense `mlp.experts.gate_up_proj` [E, H, 2 I] (gate / up columns alternating), `down_proj` [E, I, H]
    and `*_bias`
  transformers' in-memory names: `(mlp|block_sparse_moe).experts.gate_up_proj` [E, 2 I, H] and
    `.down_proj` [E, H, I], `router.weight`
moe_weight(name) says where a name (within its decoder layer: "model.layers.N." removed) goes, or None for a
tensor of the rest of the layer; load_moe_weight copies it in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import torch

from backend.engine.layers.fused_moe.experts import ExpertTensor, expert_matrix
from backend.engine.layers.fused_moe.layer import FusedMoE
from backend.engine.quantization import mxfp4
from backend.engine.quantization.gguf_reader import QuantizedWeight

Target = Literal[
    "router", "router_bias", "w13", "w2", "w13_bias", "w2_bias", "w13_blocks", "w13_scales", "w2_blocks",
    "w2_scales", "shared_gate_up", "shared_down", "shared_gate",
]  # fmt: skip
Shard = Literal["gate", "up", "all"]


@dataclass(frozen=True, slots=True)
class MoEWeight:
    target: Target
    expert: int | None = None  # a per-expert tensor's expert; None: every expert's, stacked
    shard: Shard = "all"  # per-expert gate_up halves: "gate" or "up"


BLOCK = r"(?:block_sparse_moe|mlp)\."
EXPERT = BLOCK + r"experts\.(\d+)\."
RULES: tuple[tuple[str, Target, Shard], ...] = (  # a full match of the name -> where it goes
    (BLOCK + r"(?:gate|router|router\.layer)\.weight", "router", "all"),
    (BLOCK + r"router\.bias", "router_bias", "all"),
    (EXPERT + r"(?:w1|gate_proj)\.weight", "w13", "gate"),
    (EXPERT + r"(?:w3|up_proj)\.weight", "w13", "up"),
    (EXPERT + r"(?:w2|down_proj)\.weight", "w2", "all"),
    (BLOCK + r"(?:experts\.gate_up_proj|input_linear\.weight)", "w13", "all"),
    (BLOCK + r"(?:experts\.down_proj|output_linear\.weight)", "w2", "all"),
    (BLOCK + r"experts\.gate_up_proj_bias", "w13_bias", "all"),
    (BLOCK + r"experts\.down_proj_bias", "w2_bias", "all"),
    (BLOCK + r"experts\.gate_up_proj_blocks", "w13_blocks", "all"),
    (BLOCK + r"experts\.gate_up_proj_scales", "w13_scales", "all"),
    (BLOCK + r"experts\.down_proj_blocks", "w2_blocks", "all"),
    (BLOCK + r"experts\.down_proj_scales", "w2_scales", "all"),
    (r"mlp\.shared_expert\.gate_proj\.weight", "shared_gate_up", "gate"),  # Qwen2-MoE
    (r"mlp\.shared_expert\.up_proj\.weight", "shared_gate_up", "up"),
    (r"mlp\.shared_expert\.down_proj\.weight", "shared_down", "all"),
    (r"mlp\.shared_expert_gate\.weight", "shared_gate", "all"),
    (r"shared_mlp\.input_linear\.weight", "shared_gate_up", "all"),  # GraniteMoeShared: gate, then up
    (r"shared_mlp\.output_linear\.weight", "shared_down", "all"),
)
_COMPILED = tuple((re.compile(pattern), target, shard) for pattern, target, shard in RULES)
# a GGUF file's stacked experts, one tensor per projection (gguf/tensor_names.py): dense [E, n, k] or blocks;
# gpt-oss's files split gate_up's bias too (its down bias is the checkpoints' down_proj_bias [E, H])
_STACKED = re.compile(BLOCK + r"experts\.(gate|up|down)_proj")
_STACKED_BIAS = re.compile(BLOCK + r"experts\.(gate|up)_proj_bias")


def stacked_projection(name: str) -> str | None:
    """ "gate", "up" or "down" for a GGUF file's stacked experts of one projection (name within its decoder
    layer), "gate_bias" or "up_bias" for gpt-oss's split biases [E, I], else None. transformers' in-memory
    `experts.down_proj` [E, H, I] has the same name and layout."""
    match = _STACKED.fullmatch(name)
    if match:
        return match.group(1)
    match = _STACKED_BIAS.fullmatch(name)
    return f"{match.group(1)}_bias" if match else None


def moe_weight(name: str) -> MoEWeight | None:
    """Where the checkpoint tensor `name` (within its decoder layer) goes in the layer's FusedMoE."""
    for pattern, target, shard in _COMPILED:
        match = pattern.fullmatch(name)
        if match:
            return MoEWeight(target, int(match.group(1)) if match.groups() else None, shard)
    return None


def halves(rows: torch.Tensor) -> torch.Tensor:
    """gpt-oss's alternating gate / up rows [.., 2 I, ..] (dim 1) as gate rows, then up rows."""
    return torch.cat((rows[:, 0::2], rows[:, 1::2]), dim=1)


def load_moe_weight(layer: FusedMoE, weight: MoEWeight, tensor: torch.Tensor) -> None:
    """Copy one checkpoint tensor into layer (MXFP4 blocks wait for their scales, and the other way)."""
    gpt_oss, inter = layer.config.gpt_oss_layout, layer.config.intermediate_size
    target = weight.target
    if target in ("w13_blocks", "w13_scales", "w2_blocks", "w2_scales"):
        return _mxfp4_part(layer, target, tensor)
    if target in ("router", "router_bias", "shared_gate"):
        module = layer.gate if target != "shared_gate" else layer.shared_expert_gate
        _copy(getattr(module, "bias" if target == "router_bias" else "weight"), tensor, target)
    elif target in ("shared_gate_up", "shared_down"):
        assert layer.shared_expert is not None, "a shared expert's tensor for a block without one"
        linear = (
            layer.shared_expert.gate_up_proj if target == "shared_gate_up" else layer.shared_expert.down_proj
        )
        shared = layer.config.shared_intermediate_size
        rows = {"gate": slice(0, shared), "up": slice(shared, 2 * shared), "all": slice(None)}[weight.shard]
        _copy(linear.weight[rows], tensor, target)
    elif target in ("w13_bias", "w2_bias"):
        _copy(getattr(layer, target), halves(tensor) if target == "w13_bias" and gpt_oss else tensor, target)
    elif weight.expert is not None:  # one expert's gate, up or down
        rows = {"gate": slice(0, inter), "up": slice(inter, 2 * inter), "all": slice(None)}[weight.shard]
        _copy(
            getattr(layer, f"{target}_weight")[weight.expert, rows],
            tensor,
            f"{target} expert {weight.expert}",
        )
    elif gpt_oss:  # [E, k, n]: transposed, gate_up's gate / up columns alternating
        stacked = tensor.transpose(1, 2)
        _copy(getattr(layer, f"{target}_weight"), halves(stacked) if target == "w13" else stacked, target)
    else:
        _copy(getattr(layer, f"{target}_weight"), tensor, target)


def _copy(destination: torch.Tensor | None, tensor: torch.Tensor, what: str) -> None:
    if destination is None or destination.shape != tensor.shape:
        shape = None if destination is None else tuple(destination.shape)
        raise ValueError(f"MoE checkpoint tensor {what}: expected shape {shape}, got {tuple(tensor.shape)}")
    with torch.no_grad():
        destination.copy_(tensor)


def _mxfp4_part(layer: FusedMoE, target: str, tensor: torch.Tensor) -> None:
    """Keep an MXFP4 *_blocks / *_scales tensor until its partners come; with all four, the experts as GGUF
    blocks (gate_up's rows reordered: each expert's gate rows, then its up rows)."""
    pending = layer.pending_mxfp4
    pending[target] = tensor
    if len(pending) < 4:
        return
    w13 = mxfp4.from_gpt_oss(halves(pending.pop("w13_blocks")), halves(pending.pop("w13_scales")))
    w2 = mxfp4.from_gpt_oss(pending.pop("w2_blocks"), pending.pop("w2_scales"))
    layer.set_quantized_experts(w13, w2)


def gguf_experts(
    block: FusedMoE,
    gate: ExpertTensor,  # GGUF ffn_gate_exps: blocks [E * I, row bytes] (gguf_reader), or dense [E, I, H]
    up: ExpertTensor,  # ffn_up_exps, the same
    down: ExpertTensor,  # ffn_down_exps: [E * H, row bytes], or dense [E, H, I]
    biases: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    | None = None,  # gpt-oss: gate [E, I], up, down [E, H]
) -> None:
    """One layer's experts from a GGUF file into block, kept as stored: gate and up of one type joined per
    expert into w13's blocks (gate rows, then up rows: whole blocks move); a dense (dequantized) projection,
    or gate and up of different types, copied into the dense parameters."""
    experts, inter = block.config.num_experts, block.config.intermediate_size
    if isinstance(gate, QuantizedWeight) and isinstance(up, QuantizedWeight) and gate.qtype == up.qtype:
        rows = torch.cat((gate.data.view(experts, inter, -1), up.data.view(experts, inter, -1)), 1)
        w13 = QuantizedWeight(
            gate.qtype, rows.reshape(experts * 2 * inter, -1), (experts * 2 * inter, gate.shape[1])
        )
        block.set_quantized_experts(w13=w13)
    else:
        _copy(block.w13_weight, torch.cat((_dense(gate, experts), _dense(up, experts)), 1), "w13 (gate, up)")
    if isinstance(down, QuantizedWeight):
        block.set_quantized_experts(w2=down)
    else:
        _copy(block.w2_weight, _dense(down, experts), "w2 (down)")
    if biases is not None:
        _copy(block.w13_bias, torch.cat(biases[:2], 1), "w13 bias")
        _copy(block.w2_bias, biases[2], "w2 bias")


def gguf_expert_biases(block: FusedMoE, gate: torch.Tensor, up: torch.Tensor) -> None:
    """gpt-oss's GGUF gate and up biases [E, I] into w13_bias (gate, then up, as w13's rows)."""
    _copy(block.w13_bias, torch.cat((gate, up), 1), "w13 bias (gate, up)")


def _dense(weight: ExpertTensor, experts: int) -> torch.Tensor:
    """[E, n, k] float of a projection's experts (GGUF blocks decoded exactly)."""
    if isinstance(weight, torch.Tensor):
        return weight.view(experts, -1, weight.shape[-1])
    return torch.stack([expert_matrix(weight, e, experts, torch.float32) for e in range(experts)])
