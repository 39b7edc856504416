"""A FusedMoE's calls in a captured decode step (decode_graph.py): the router's projection, the shared
expert's where the family has one, then the block's native call (graph_ops.moe_op), each the call the eager
module makes, into buffers sized for the graph's rows (one MoEBuffers serves every MoE layer of a model)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.engine.graph_ops import Op, linear_ops, moe_op, silu_and_mul_op, unsupported_linear
from backend.engine.layers.fused_moe.layer import FusedMoE


@dataclass(slots=True)
class MoEBuffers:
    """Flat storage for a MoE layer's captured calls, S rows: each call takes a contiguous [S, width] view
    of the first S * width elements (the kernels read rows width apart), so one serves every MoE layer."""

    rows: int
    activations: tuple[torch.Tensor, ...]  # logits, shared output, shared gate_up, activation, gate: flat
    workspace: torch.Tensor  # uint8: csrc/moe.cpp's for S rows

    def view(self, index: int, width: int) -> torch.Tensor:
        return self.activations[index][: self.rows * width].view(self.rows, width)


def unsupported_moe(layer: FusedMoE, dtype: torch.dtype) -> str | None:
    """Why a MoE layer has no captured calls (None: it has)."""
    if layer.native is None:
        return "MoE experts not on the native kernel (csrc/moe.cpp)"
    projections = [layer.gate, layer.shared_expert_gate]
    if layer.shared_expert is not None:
        projections += [layer.shared_expert.gate_up_proj, layer.shared_expert.down_proj]
    return next((r for p in projections if p is not None and (r := unsupported_linear(p, dtype))), None)


def widths(layer: FusedMoE) -> tuple[int, int, int, int, int]:
    """The widths of a layer's views: logits, shared output, shared gate_up, its activation, shared gate."""
    config = layer.config
    shared = config.shared_intermediate_size
    return (config.num_experts, config.hidden_size, 2 * shared, shared, 1)


def moe_buffers(layers: list[FusedMoE], rows: int, dtype: torch.dtype, device: torch.device) -> MoEBuffers:
    """Buffers for rows rows that every layer in layers can use (their largest sizes)."""
    largest = [max(column) for column in zip(*map(widths, layers), strict=True)]
    flat = tuple(torch.zeros(rows * width, dtype=dtype, device=device) for width in largest)
    workspace = max(layer.native.workspace_bytes(rows) for layer in layers if layer.native is not None)
    return MoEBuffers(rows, flat, torch.zeros(workspace, dtype=torch.uint8, device=device))


def moe_ops(layer: FusedMoE, x: torch.Tensor, out: torch.Tensor, buffers: MoEBuffers) -> list[Op]:
    """out [S, H] = layer(x [S, H]) as captured calls (unsupported_moe(layer) must be None)."""
    assert layer.native is not None
    logits_width, hidden, gate_up_width, inter, _ = widths(layer)
    logits = buffers.view(0, logits_width)
    ops = linear_ops(layer.gate, x, logits)
    shared = gate = None
    if layer.shared_expert is not None:
        mlp = layer.shared_expert
        shared, activation = buffers.view(1, hidden), buffers.view(3, inter)
        if mlp.fused_silu_and_mul:
            ops += linear_ops(mlp.gate_up_proj, x, activation)
        else:
            gate_up = buffers.view(2, gate_up_width)
            ops += [*linear_ops(mlp.gate_up_proj, x, gate_up), silu_and_mul_op(gate_up, activation)]
        ops += linear_ops(mlp.down_proj, activation, shared)
    if layer.shared_expert_gate is not None:
        gate = buffers.view(4, 1)
        ops += linear_ops(layer.shared_expert_gate, x, gate)
    return [*ops, moe_op(layer.native, x, logits, (shared, gate), out, buffers.workspace)]
