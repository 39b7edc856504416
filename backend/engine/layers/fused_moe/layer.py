"""FusedMoE: a decoder's mixture-of-experts block (vLLM's FusedMoE), one module for every family config.py
knows: the router (a Linear, with a bias for gpt-oss), top-k routing, the routed experts and a shared expert
where the family has one.

Experts are stacked per projection: w13_weight [E, 2 I, H] (each expert's gate rows, then its up rows) and
w2_weight [E, H, I] dense, or GGUF blocks of the experts on rows (set_quantized_experts; MXFP4 included),
kept as stored. prepare_experts() puts both projections on csrc/moe.cpp where a native format serves them
(native.py): then forward is the router's call, the shared expert's and one native call that routes, runs
every routed expert on its rows and combines. Otherwise forward runs routing.py and experts.py in PyTorch.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from backend.engine.layers.fused_moe.config import MoEConfig
from backend.engine.layers.fused_moe.experts import ExpertTensor, activation, expert_matrix, fused_experts
from backend.engine.layers.fused_moe.native import NativeMoE, native_experts
from backend.engine.layers.fused_moe.routing import select_experts
from backend.engine.layers.linear import Linear
from backend.engine.layers.mlp import GatedMLP
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.quantized_linear import Scratch


class FusedMoE(nn.Module):
    def __init__(self, config: MoEConfig, scratch: Scratch | None = None) -> None:
        super().__init__()
        self.config = config
        experts, hidden, inter = config.num_experts, config.hidden_size, config.intermediate_size
        self.gate = Linear(hidden, experts, bias=config.router_bias)  # the router
        self.w13_weight = nn.Parameter(torch.empty(experts, 2 * inter, hidden), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(experts, hidden, inter), requires_grad=False)
        self.w13_bias = self.w2_bias = None
        if config.expert_bias:
            self.w13_bias = nn.Parameter(torch.zeros(experts, 2 * inter), requires_grad=False)
            self.w2_bias = nn.Parameter(torch.zeros(experts, hidden), requires_grad=False)
        shared = config.shared_intermediate_size
        self.shared_expert = GatedMLP(hidden, shared, bias=False) if shared else None
        self.shared_expert_gate = Linear(hidden, 1, bias=False) if config.shared_expert_gate else None
        for router in (self.gate, self.shared_expert_gate):
            if router is not None:
                router.is_router = True
        self.quantized: dict[str, QuantizedWeight] = {}  # "w13" / "w2" kept as GGUF blocks
        self.pending_mxfp4: dict[
            str, torch.Tensor
        ] = {}  # checkpoint.py: MXFP4 blocks / scales until all came
        self.native: NativeMoE | None = None
        self.output_scale = 1.0  # a factor on the output not folded into w2 (scale_output)
        # token -> expert assignments per expert since the block was built (EngineStats.expert_tokens_total)
        self.expert_counts = np.zeros(experts, dtype=np.int64)
        self.scratch = scratch if scratch is not None else Scratch()  # the native call's workspace

    def set_quantized_experts(
        self, w13: QuantizedWeight | None = None, w2: QuantizedWeight | None = None
    ) -> None:
        """Experts kept as GGUF blocks (either projection, or both): w13 [E * 2 I, row bytes] (expert e's gate
        rows, then its up rows), w2 [E * H, row bytes]; the dense parameter each replaces is dropped."""
        config = self.config
        want = {"w13": (config.num_experts * 2 * config.intermediate_size, config.hidden_size)}
        want["w2"] = (config.num_experts * config.hidden_size, config.intermediate_size)
        for name, weight in (("w13", w13), ("w2", w2)):
            if weight is None:
                continue
            if tuple(weight.shape) != want[name]:
                raise ValueError(
                    f"{name} experts must be {want[name]} (experts stacked on rows), got {weight.shape}"
                )
            self.quantized[name] = weight
            dense = getattr(self, f"{name}_weight")
            setattr(self, f"{name}_weight", nn.Parameter(dense.new_empty(0), requires_grad=False))
            self.register_buffer(f"{name}_blocks", weight.data)  # counted by weights_bytes, moved by .to()

    def experts(self) -> tuple[ExpertTensor, ExpertTensor]:
        """(w13, w2): each dense [E, n, k] or GGUF blocks of the experts on rows."""
        return self.quantized.get("w13", self.w13_weight), self.quantized.get("w2", self.w2_weight)

    def prepare_experts(self, use_kernels: bool) -> None:
        """Both projections on csrc/moe.cpp where a native format serves them (after the model prepared its
        Linears); the stacked weights the native copies replace are dropped."""
        dtype = self.gate.weight.dtype  # the model's (Linear.prepare keeps it on the emptied weight)
        w13, w2 = self.experts()
        projections = [
            native_experts(w, self.config.num_experts, dtype) if use_kernels else None for w in (w13, w2)
        ]
        if projections[0] is None or projections[1] is None:
            return
        self.native = NativeMoE(
            self.config,
            (projections[0], projections[1]),
            (self.w13_bias, self.w2_bias),
            dtype,
            self.output_scale,
            self.expert_counts,
        )
        for name in ("w13", "w2"):
            if self.quantized.pop(name, None) is not None:
                delattr(self, f"{name}_blocks")
            else:
                dense = getattr(self, f"{name}_weight")
                setattr(self, f"{name}_weight", nn.Parameter(dense.new_empty(0), requires_grad=False))
        for i, tensor in enumerate(self.native.tensors()[:2]):
            self.register_buffer(f"native_{i}", tensor)

    def shared_output(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(the shared expert's output [T, H], its gate's logits [T, 1]), None where the family has none."""
        shared = None if self.shared_expert is None else self.shared_expert(x)
        gate = None if self.shared_expert_gate is None else self.shared_expert_gate(x)
        return shared, gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        logits = self.gate(x)
        shared, shared_gate = self.shared_output(x)
        if self.native is not None:
            x, logits = x.contiguous(), logits.contiguous()
            workspace = self.scratch.get(self.native.workspace_bytes(x.shape[0]), torch.uint8, x.device)
            return self.native.forward(x, logits, shared, shared_gate, workspace)
        weights, ids = select_experts(logits, self.config)
        self.expert_counts += np.bincount(ids.reshape(-1).cpu().numpy(), minlength=self.config.num_experts)
        out = fused_experts(x, weights, ids, self.config.num_experts, self.expert_forward)
        if shared is not None:
            out = out + (shared if shared_gate is None else torch.sigmoid(shared_gate) * shared)
        return out if self.output_scale == 1.0 else out * self.output_scale

    def scale_output(self, factor: float) -> None:
        """This block's output times factor (Granite-MoE's residual_multiplier): folded into the dense down
        experts (and the shared expert's down_proj) before prepare_experts, else applied on the output."""
        if "w2" in self.quantized or self.native is not None or self.w2_weight.numel() == 0:
            self.output_scale *= factor
            return
        self.w2_weight.data.mul_(factor)
        if self.w2_bias is not None:
            self.w2_bias.data.mul_(factor)
        if self.shared_expert is not None:
            self.shared_expert.scale_output(factor)

    def expert_forward(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        """One expert on its rows [R, H] in PyTorch (transformers' per-expert computation)."""
        w13, w2 = self.experts()
        num_experts = self.config.num_experts
        b13 = None if self.w13_bias is None else self.w13_bias[expert]
        b2 = None if self.w2_bias is None else self.w2_bias[expert]
        gate_up = torch.nn.functional.linear(rows, expert_matrix(w13, expert, num_experts, rows.dtype), b13)
        hidden = activation(gate_up, self.config)
        return torch.nn.functional.linear(hidden, expert_matrix(w2, expert, num_experts, rows.dtype), b2)
