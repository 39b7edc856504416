"""MoECausalLM: the base of the mixture-of-experts families (Mixtral, Qwen3-MoE, OLMoE, Granite-MoE): a
CausalLM whose sparse layers' MLP is a FusedMoE block (layers/fused_moe/, docs/moe.md), the others a
GatedMLP.

A block's checkpoint tensors go through fused_moe/checkpoint.py rather than CheckpointNames: per-expert
tensors (Hub / save_pretrained), Granite's stacked ones, or a GGUF file's experts stacked per projection,
whose quantized blocks the block keeps as stored (take_quantized holds them until load_hf_state_dict has
the rest of the layer). prepare_weights puts the experts on csrc/moe.cpp where a native format serves them.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from backend.engine import cpu_kernels
from backend.engine.layers.fused_moe import FusedMoE, MoEWeight, load_moe_weight, moe_config, moe_weight
from backend.engine.layers.fused_moe.checkpoint import gguf_expert_biases, gguf_experts, stacked_projection
from backend.engine.layers.fused_moe.experts import ExpertTensor
from backend.engine.models.args import ModelArgs
from backend.engine.models.base import CausalLM
from backend.engine.models.checkpoint import CheckpointNames
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.quantized_linear import Part, Scratch

_LAYER = re.compile(r"(?:model\.)?layers\.(\d+)\.(.+)")


def moe_tensor(name: str) -> tuple[int, str] | None:
    """(layer, name within the layer) of a checkpoint tensor of a MoE block, else None."""
    match = _LAYER.fullmatch(name)
    if match is None:
        return None
    rest = match.group(2)
    if moe_weight(rest) is None and stacked_projection(rest) is None:
        return None
    return int(match.group(1)), rest


class MoECheckpointNames(CheckpointNames):
    """CheckpointNames of the layers around the MoE blocks: a block's tensors are none of its business."""

    __slots__ = ()

    def target(self, name: str) -> tuple[str, int | None] | None:
        return None if moe_tensor(name) is not None else CheckpointNames.target(self, name)


class MoECausalLM(CausalLM):
    def __init__(self, args: ModelArgs, hf_config: Any) -> None:
        super().__init__(args, hf_config)
        self.pending_experts: dict[str, QuantizedWeight] = {}  # take_quantized -> load_hf_state_dict

    # ---- hooks a MoE family overrides ----
    def sparse_layer(self, layer: int) -> bool:
        """Whether layer's MLP is a MoE block (every layer here; Qwen3-MoE's config may say otherwise)."""
        return True

    def make_mlp(self, layer: int) -> nn.Module:
        if not self.sparse_layer(layer):
            return super().make_mlp(layer)
        if "moe_scratch" not in self.__dict__:
            self.moe_scratch = Scratch()  # one native workspace for every block
        return FusedMoE(moe_config(self.config), self.moe_scratch)

    # ---- the blocks ----
    def moe_blocks(self) -> list[FusedMoE]:
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, FusedMoE)]

    def expert_tokens_total(self) -> list[list[int]]:
        """Per MoE layer, per expert: the token -> expert assignments routed since the model was built."""
        return [block.expert_counts.tolist() for block in self.moe_blocks()]

    # ---- weights ----
    def checkpoint_names(self) -> CheckpointNames:
        sparse = {f"layers.{i}.mlp." for i in range(self.args.num_layers) if self.sparse_layer(i)}
        params: dict[str, torch.Tensor] = {
            name: p
            for name, p in self.named_parameters()
            if not any(name.startswith(prefix) for prefix in sparse)
        }
        return MoECheckpointNames(params, self.packed_modules_mapping, self.lm_head is None)

    def take_quantized(self, quantized: dict[str, Part]) -> dict[str, Part]:
        experts = {n: w for n, w in quantized.items() if moe_tensor(n) and isinstance(w, QuantizedWeight)}
        self.pending_experts = experts
        return {n: w for n, w in quantized.items() if n not in experts}

    def load_hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        moe = {name: state_dict.pop(name) for name in list(state_dict) if moe_tensor(name)}
        stacked: dict[int, dict[str, ExpertTensor]] = {}
        loaded: dict[int, set[str]] = {}
        blocks = {i: layer.mlp for i, layer in enumerate(self.layers) if isinstance(layer.mlp, FusedMoE)}
        tensors: list[tuple[str, ExpertTensor]] = [*moe.items(), *self.pending_experts.items()]
        moe.clear()
        self.pending_experts = {}
        tensors.reverse()
        while tensors:  # each tensor as read dropped once loaded, so the experts are not held twice
            name, tensor = tensors.pop()
            found = moe_tensor(name)
            assert found is not None
            layer, rest = found
            if layer not in blocks:
                raise ValueError(f"unexpected weight {name!r}: layer {layer} has no MoE block")
            projection = stacked_projection(rest)
            if projection is not None:
                stacked.setdefault(layer, {})[projection] = tensor
                continue
            weight = moe_weight(rest)
            assert weight is not None and isinstance(tensor, torch.Tensor)
            load_moe_weight(blocks[layer], weight, tensor)
            loaded.setdefault(layer, set()).add(weight.target.removesuffix("_blocks").removesuffix("_scales"))
        for layer, projections in stacked.items():
            loaded.setdefault(layer, set()).update(_load_stacked(blocks[layer], projections))
        for layer in blocks:
            missing = {"router", "w13", "w2"} - loaded.get(layer, set())
            if missing:
                raise ValueError(
                    f"MoE weights missing from the checkpoint in layer {layer}: {sorted(missing)}"
                )
        super().load_hf_state_dict(state_dict)

    def prepare_weights(self) -> None:
        super().prepare_weights()
        weight = self.norm.weight
        use_kernels = cpu_kernels.supports(weight.device, weight.dtype)
        for block in self.moe_blocks():
            block.prepare_experts(use_kernels)


def _load_stacked(block: FusedMoE, projections: dict[str, ExpertTensor]) -> set[str]:
    """A GGUF layer's stacked experts into block (quantized ones kept as stored); the targets filled."""
    if "gate" in projections or "up" in projections:
        if not {"gate", "up", "down"} <= set(projections):
            raise ValueError(
                f"a MoE layer's stacked experts need gate, up and down; got {sorted(projections)}"
            )
        gguf_experts(block, projections["gate"], projections["up"], projections["down"])
        gate_bias, up_bias = projections.get("gate_bias"), projections.get("up_bias")
        if gate_bias is not None or up_bias is not None:  # gpt-oss
            if not isinstance(gate_bias, torch.Tensor) or not isinstance(up_bias, torch.Tensor):
                raise ValueError("a MoE layer's split expert biases need gate_proj_bias and up_proj_bias")
            gguf_expert_biases(block, gate_bias, up_bias)
        return {"w13", "w2"}
    down = projections["down"]  # transformers' in-memory experts.down_proj [E, H, I]
    if not isinstance(down, torch.Tensor):
        raise ValueError("quantized down experts without their gate and up experts")
    load_moe_weight(block, MoEWeight("w2"), down)
    return {"w2"}
