"""The experts of a MoE block in PyTorch: the always-correct path (CUDA, fp32 on CPUs the native kernel does
not serve, PLAYGROUND_CPU_KERNELS=0) and the reference of csrc/moe.cpp.

Experts are held stacked: dense [E, n, k] tensors (gate_up: each expert's gate rows, then its up rows), or
one QuantizedWeight of GGUF blocks [E * n, row bytes] (MXFP4 included) per projection. fused_experts sorts
the token-expert pairs by expert, runs each routed expert once on its rows (the loop over experts is this
path's; the native one has none) and adds the weighted outputs back per token in ascending expert order,
the order of transformers' loop over experts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from backend.engine.layers.fused_moe.config import MoEConfig
from backend.engine.quantization import mxfp4
from backend.engine.quantization.gguf_blocks import dequantize
from backend.engine.quantization.gguf_reader import QuantizedWeight

ExpertTensor = torch.Tensor | QuantizedWeight  # dense [E, n, k], or GGUF blocks of the experts on rows


def expert_matrix(weight: ExpertTensor, expert: int, num_experts: int, dtype: torch.dtype) -> torch.Tensor:
    """Expert expert's [n, k] in dtype (quantized blocks decoded in fp32 first, exactly)."""
    if isinstance(weight, torch.Tensor):
        return weight[expert]
    n = weight.shape[0] // num_experts
    rows = weight.data[expert * n : (expert + 1) * n]
    decoded = mxfp4.dequantize(rows) if weight.qtype == mxfp4.QTYPE else dequantize(rows, weight.qtype)
    return decoded.to(dtype)


def activation(gate_up: torch.Tensor, config: MoEConfig) -> torch.Tensor:
    """[R, 2 I] (gate, then up) -> [R, I]: SiLU-and-multiply, or gpt-oss's GptOssExperts._apply_gate."""
    gate, up = gate_up.chunk(2, dim=-1)
    if config.activation == "silu":
        return F.silu(gate) * up
    gate = gate.clamp(min=None, max=config.swiglu_limit)
    up = up.clamp(min=-config.swiglu_limit, max=config.swiglu_limit)
    return (up + 1) * (gate * torch.sigmoid(gate * config.swiglu_alpha))


def fused_experts(
    x: torch.Tensor,  # [T, H]
    topk_weights: torch.Tensor,  # [T, K] float32
    topk_ids: torch.Tensor,  # [T, K] int64
    num_experts: int,
    expert_forward: Callable[[int, torch.Tensor], torch.Tensor],  # (expert, rows [R, H]) -> [R, H]
) -> torch.Tensor:
    """sum over each token's experts of weight * expert_forward(expert, x[token]): [T, H] in x's dtype."""
    top_k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs by expert, tokens in order within one
    tokens = order // top_k
    rows = x.index_select(0, tokens)
    outputs = torch.empty_like(rows)
    start = 0
    for expert, count in enumerate(torch.bincount(flat, minlength=num_experts).tolist()):
        if count:
            outputs[start : start + count] = expert_forward(expert, rows[start : start + count])
            start += count
    weighted = outputs * topk_weights.reshape(-1)[order].unsqueeze(1)
    return torch.zeros_like(x).index_add_(0, tokens, weighted.to(x.dtype))
