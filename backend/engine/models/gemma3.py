"""Gemma 3 text models (google/gemma-3-270m, -1b: Gemma3ForCausalLM). Differences from Llama: embeddings
times sqrt(hidden_size) (kept as CausalLM.embedding_scale, exact); four norms per layer
(SandwichDecoderLayer with pre-norms), every RMSNorm scaling by (1 + weight) (fold_scales adds the 1);
per-head q/k norm; softmax scale query_pre_attn_scalar ** -0.5; the gelu_pytorch_tanh gated MLP; local
(sliding_attention) and global layers with their own RoPE theta (RopeSpec.layer_type); the logits
soft-capped by final_logit_softcapping.

Local layers' windows come from the config (sliding_window.layer_windows: layer_types, else every 6th layer
global) into each layer's AttentionSpec, which the paged attention kernels and the PyTorch path take.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from backend.engine.layers.attention import Attention, AttentionSpec
from backend.engine.layers.decoder import SandwichDecoderLayer
from backend.engine.layers.norm import RMSNorm
from backend.engine.layers.rotary import RopeSpec
from backend.engine.models.args import ModelArgs
from backend.engine.models.base import CausalLM


class Gemma3ForCausalLM(CausalLM):
    def __init__(self, args: ModelArgs, hf_config: Any) -> None:
        super().__init__(args, hf_config)
        self.embedding_scale = args.hidden_size**0.5  # transformers' Gemma3TextScaledWordEmbedding
        self.final_logit_softcapping = getattr(hf_config, "final_logit_softcapping", None)

    @classmethod
    def args_from_config(cls, hf_config: Any, weight_names: Collection[str]) -> ModelArgs:
        if getattr(hf_config, "use_bidirectional_attention", False):
            raise ValueError(
                "Gemma 3 with use_bidirectional_attention (an embedding model) is not a causal LM"
            )
        return replace(
            ModelArgs.from_hf_config(hf_config, weight_names),
            hidden_act=getattr(hf_config, "hidden_activation", None) or "gelu_pytorch_tanh",
            attention_scale=float(hf_config.query_pre_attn_scalar) ** -0.5,
            qk_norm=True,
        )

    def attention_spec(self, layer: int) -> AttentionSpec:
        spec = super().attention_spec(layer)
        layer_type = self.config.layer_types[layer]
        return replace(
            spec,
            rope=RopeSpec(self.args.rotary_dim, layer_type),
            logits_soft_cap=getattr(self.config, "attn_logit_softcapping", None),
        )

    def make_layer(self, layer: int) -> nn.Module:
        a = self.args
        attention = Attention(
            a.hidden_size, self.attention_specs[layer], (a.qkv_bias, a.o_bias), a.rms_norm_eps
        )
        return SandwichDecoderLayer(attention, self.make_mlp(layer), a.hidden_size, a.rms_norm_eps, True)

    def fold_scales(self) -> None:
        """Gemma's norms scale by (1 + weight): add the 1 into every norm's weight, once, after loading."""
        super().fold_scales()
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.weight.data.add_(1.0)

    def compute_logits(self, x: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        logits = super().compute_logits(x)
        cap = self.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
