"""GatedMLP: down(act(gate(x)) * up(x)) with gate and up fused into one projection (gate rows, then up).

Both activations run on cpu_kernels: SiLU as silu_and_mul (or inside gemm_bf16 when the projection packs
gate and up panels in turn: Linear.fused_silu_and_mul), GELU(tanh) as gelu_tanh_and_mul; PyTorch computes
them elsewhere. output_scale is a constant factor on the output that could not be folded into down_proj's
weight (a quantized one: CausalLM.fold_scales).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from backend.engine import cpu_kernels
from backend.engine.layers.linear import Linear, fold_output_scale

# transformers' ACT2FN names this layer computes
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}
# act(gate) * up of gate_up [T, 2 I] in one native call, per activation
KERNELS = {"silu": cpu_kernels.silu_and_mul, "gelu_pytorch_tanh": cpu_kernels.gelu_tanh_and_mul}


class GatedMLP(nn.Module):
    use_kernel = False  # set by CausalLM.prepare_weights
    fused_silu_and_mul = False  # gate_up_proj computes silu(gate) * up itself (set by prepare_weights)

    def __init__(
        self, hidden_size: int, intermediate_size: int, bias: bool, hidden_act: str = "silu"
    ) -> None:
        super().__init__()
        if hidden_act not in ACTIVATIONS:
            raise ValueError(f"Unsupported hidden_act {hidden_act!r}; supported: {', '.join(ACTIVATIONS)}")
        self.hidden_act = hidden_act
        self.intermediate_size = intermediate_size
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.gate_up_proj.is_gate_up = hidden_act == "silu"  # prepare() may fuse SiLU-and-mul in
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)
        self.output_scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, hidden]
        out = self.down_proj(self.activation(x))
        return out if self.output_scale == 1.0 else out * self.output_scale

    def scale_output(self, factor: float) -> None:
        """This MLP's output times factor: in down_proj's weight where it is dense, else at run time."""
        if not fold_output_scale(self.down_proj, factor):
            self.output_scale *= factor

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """act(gate(x)) * up(x), [T, intermediate_size]."""
        if self.fused_silu_and_mul:
            assert isinstance(self.gate_up_proj, Linear)
            return self.gate_up_proj.silu_and_mul(x)
        gate_up = self.gate_up_proj(x)
        if self.use_kernel and gate_up.is_contiguous():
            return KERNELS[self.hidden_act](gate_up)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return ACTIVATIONS[self.hidden_act](gate) * up
