"""Top-k routing in PyTorch, op for op as transformers 5.24's routers compute it (config.py's families): the
weights in fp32, the experts as torch.topk orders them (largest first). csrc/moe.cpp's native routing computes
the same in fp32 (its ties go to the lower expert index)."""

from __future__ import annotations

import torch

from backend.engine.layers.fused_moe.config import MoEConfig


def select_experts(
    router_logits: torch.Tensor,  # [T, E]
    config: MoEConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights [T, K] float32, topk_ids [T, K] int64) for each token."""
    if config.scoring == "softmax_topk":  # Mixtral, Qwen2/3-MoE, OLMoE
        probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, config.top_k, dim=-1)
    else:  # Granite-MoE, gpt-oss
        values, ids = torch.topk(router_logits.float(), config.top_k, dim=-1)
        weights = torch.softmax(values, dim=-1)
    if config.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
