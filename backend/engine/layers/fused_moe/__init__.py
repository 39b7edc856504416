"""The mixture-of-experts block (vLLM's FusedMoE): config, routing, experts in PyTorch and on csrc/moe.cpp,
and checkpoint name mapping."""

from backend.engine.layers.fused_moe.checkpoint import MoEWeight, load_moe_weight, moe_weight
from backend.engine.layers.fused_moe.config import MoEConfig, moe_config
from backend.engine.layers.fused_moe.layer import FusedMoE

__all__ = ["FusedMoE", "MoEConfig", "MoEWeight", "load_moe_weight", "moe_config", "moe_weight"]
