"""Mixtral: Llama's decoder with a MoE block in every layer (softmax over the experts, top-k, renormalised;
fused_moe/config.py). Its sliding window, where a config sets one, caps the context as Mistral's does."""

from __future__ import annotations

from backend.engine.models.moe import MoECausalLM


class MixtralForCausalLM(MoECausalLM):
    pass
