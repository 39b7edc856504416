"""Qwen3-MoE: Qwen3's decoder (per-head q/k RMSNorm) with a MoE block in the layers transformers'
Qwen3MoeDecoderLayer makes sparse: those not in mlp_only_layers whose index + 1 is a multiple of
decoder_sparse_step; the others keep a GatedMLP of intermediate_size."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

from backend.engine.models.args import ModelArgs
from backend.engine.models.moe import MoECausalLM


class Qwen3MoeForCausalLM(MoECausalLM):
    @classmethod
    def args_from_config(cls, hf_config: Any, weight_names: Collection[str]) -> ModelArgs:
        step = getattr(hf_config, "decoder_sparse_step", 1)
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise ValueError(f"config.json's decoder_sparse_step must be a positive integer, got {step!r}")
        return replace(ModelArgs.from_hf_config(hf_config, weight_names), qk_norm=True)

    def sparse_layer(self, layer: int) -> bool:
        config = self.config
        only_mlp = getattr(config, "mlp_only_layers", None) or []
        step = getattr(config, "decoder_sparse_step", 1)
        return layer not in only_mlp and config.num_experts > 0 and (layer + 1) % step == 0
