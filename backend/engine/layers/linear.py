"""Linear: a projection whose weight is re-laid out once for the CPU's fast GEMMs (oneDNN's packed format,
or cpu_kernels.gemm_bf16's panels), and can_prepare, which says when that applies."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from backend.engine import cpu_kernels
from backend.engine.device import cpu_has_fast_bf16


class Linear(nn.Linear):
    """nn.Linear whose weight is re-laid out once for oneDNN on the CPU (prepare()), or for
    cpu_kernels.gemm_bf16 where that serves a bf16 model (AVX512_BF16 without AMX: see the README).

    oneDNN's packed GEMMs run 1.3-2.5x faster than torch's default ones on this project's CPUs. A bf16
    model on a CPU without bf16 units (AVX2), where torch's bf16 GEMM is 4-7x slower than fp32 beyond a
    few rows, also packs an fp32 copy of its bf16 weights: batches of more than SMALL_BATCH rows compute
    in fp32 and round the output to bf16 (the arithmetic of a bf16 kernel with fp32 accumulation); smaller
    ones, bound by memory traffic, keep reading the bf16 weights, half the bytes. That costs 3x the bf16
    weight memory, counted in weights_bytes().
    """

    SMALL_BATCH = 4
    use_kernel = False  # set by CausalLM.prepare_weights when cpu_kernels serve this model
    packed_weight: torch.Tensor | None = None
    packed_bias: torch.Tensor | None = None
    native_weight: torch.Tensor | None = None  # cpu_kernels.gemm_bf16_pack(weight), set by prepare()
    float_output = False  # lm_head on gemm_bf16: logits come out as their fp32 copy (what the sampler takes)
    is_gate_up = False  # MLP's gate_up_proj (gate rows, then up rows): prepare() may fuse SiLU-and-mul in
    is_router = False  # a MoE block's router (or shared-expert gate): a few outputs, computed every token
    dense_f32 = False  # an fp32 router kept as loaded for cpu_kernels.linear_f32 (prepare()), captured too
    fused_silu_and_mul = False  # native_weight holds gate and up panels in turn: only silu_and_mul() reads it
    compute_dtype: torch.dtype | None = None  # set when the packed copy is fp32 for a bf16 model
    linear_pointwise: Any = None  # torch.ops.mkldnn._linear_pointwise.default where packed_weight is set

    def prepare(self) -> None:
        weight = self.weight.detach()
        self.packed_bias = None if self.bias is None else self.bias.detach()  # a view, not a Parameter
        if weight.dtype == torch.bfloat16 and weight.shape[1] % 2 == 0 and cpu_kernels.gemm_bf16_enabled():
            pairs_of_panels = weight.shape[0] % (2 * cpu_kernels.GEMM_BF16_PANEL) == 0
            self.fused_silu_and_mul = self.is_gate_up and pairs_of_panels
            if self.fused_silu_and_mul:
                self.native_weight, self.packed_bias = cpu_kernels.pack_gate_up(weight, self.packed_bias)
            else:
                self.native_weight = cpu_kernels.gemm_bf16_pack(weight)
            self.weight = nn.Parameter(weight.new_empty(0), requires_grad=False)
            return
        if (
            self.is_router
            and weight.dtype == torch.float32
            and cpu_kernels.supports(weight.device, weight.dtype)
        ):
            self.dense_f32 = True  # oneDNN's call costs more than this small product; graph_ops captures it
            return
        # the op's overload itself: calling it skips the packet's overload resolution (about 1.5 us a call)
        self.linear_pointwise = torch.ops.mkldnn._linear_pointwise.default
        if weight.dtype == torch.bfloat16 and not cpu_has_fast_bf16():
            self.compute_dtype = torch.float32
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.float(), 1)
            self.packed_bias = None if self.bias is None else self.bias.detach().float()
            return
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        self.weight = nn.Parameter(weight.new_empty(0), requires_grad=False)

    def prepared_tensors(self) -> list[torch.Tensor]:
        """What prepare() added to memory."""
        own_bias = self.compute_dtype is not None or self.fused_silu_and_mul  # a copy, not the Parameter
        prepared = (self.packed_weight, self.native_weight, self.packed_bias if own_bias else None)
        return [t for t in prepared if t is not None]

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this gate_up projection, [T, out_features / 2], in one gemm_bf16 call (the
        projection's own output is never stored); only where prepare() set fused_silu_and_mul."""
        assert self.native_weight is not None and x.dim() == 2 and x.is_contiguous()
        return cpu_kernels.gemm_bf16_silu_and_mul(x, self.native_weight, self.out_features, self.packed_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native_weight is not None or self.dense_f32:  # a native kernel on x's rows
            rows = x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, x.shape[-1]).contiguous()
            if self.native_weight is None:
                out = cpu_kernels.linear_f32(rows, self.weight, self.bias)
            else:
                dtype = torch.float32 if self.float_output else x.dtype
                bias = self.packed_bias
                out = cpu_kernels.gemm_bf16(rows, self.native_weight, self.out_features, bias, dtype)
            return out if x.dim() == 2 else out.view(*x.shape[:-1], self.out_features)
        if self.compute_dtype and x.shape[0] <= self.SMALL_BATCH:
            if self.use_kernel and x.is_contiguous():
                return cpu_kernels.linear_bf16_small(x, self.weight, self.bias)
            return F.linear(x, self.weight, self.bias)
        if self.packed_weight is None:
            return F.linear(x, self.weight, self.bias)
        h = x if self.compute_dtype is None else x.to(self.compute_dtype)
        out = self.linear_pointwise(h, self.packed_weight, self.packed_bias, "none", [], "")
        return out.to(x.dtype)


def can_prepare(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
    )


def fold_output_scale(projection: object, factor: float) -> bool:
    """Multiply a dense projection's output by factor through its weight and bias, before prepare() packs
    them; returns False for another kind of projection (a quantized one), whose caller keeps the factor."""
    if not isinstance(projection, Linear) or projection.weight.numel() == 0:
        return False
    projection.weight.data.mul_(factor)
    if projection.bias is not None:
        projection.bias.data.mul_(factor)
    return True
