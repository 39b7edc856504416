"""OLMoE: Llama's decoder with an RMSNorm over the whole q and k projections (all heads at once, before
RoPE) and a MoE block in every layer (softmax over the experts, top-k, renormalised where norm_topk_prob
says: OLMoE-1B-7B does not; fused_moe/config.py). clip_qkv (no released OLMoE sets it) is refused."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

from backend.engine.layers.attention import AttentionSpec
from backend.engine.models.args import ModelArgs
from backend.engine.models.moe import MoECausalLM


class OlmoeForCausalLM(MoECausalLM):
    @classmethod
    def args_from_config(cls, hf_config: Any, weight_names: Collection[str]) -> ModelArgs:
        if getattr(hf_config, "clip_qkv", None) is not None:
            raise ValueError(
                f"OLMoE's clip_qkv ({hf_config.clip_qkv}) is not supported; supported: clip_qkv null"
            )
        return replace(ModelArgs.from_hf_config(hf_config, weight_names), qk_norm=True)

    def attention_spec(self, layer: int) -> AttentionSpec:
        return replace(super().attention_spec(layer), qk_norm_across_heads=True)
