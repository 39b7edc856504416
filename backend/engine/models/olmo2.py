"""OLMo 2 (allenai/OLMo-2-*): Llama's decoder with the norms moved after each sublayer. A layer adds
post_attention_layernorm(attn(x)) and post_feedforward_layernorm(mlp(x)) to the stream, with no norm on a
sublayer's input (SandwichDecoderLayer without pre-norms), and q and k are each RMS-normed across all
their heads at once, before RoPE (AttentionSpec.qk_norm_across_heads)."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from backend.engine.layers.attention import Attention, AttentionSpec
from backend.engine.layers.decoder import SandwichDecoderLayer
from backend.engine.models.base import CausalLM


class Olmo2ForCausalLM(CausalLM):
    def attention_spec(self, layer: int) -> AttentionSpec:
        return replace(super().attention_spec(layer), qk_norm=True, qk_norm_across_heads=True)

    def make_layer(self, layer: int) -> nn.Module:
        a = self.args
        attention = Attention(
            a.hidden_size, self.attention_specs[layer], (a.qkv_bias, a.o_bias), a.rms_norm_eps
        )
        return SandwichDecoderLayer(attention, self.make_mlp(layer), a.hidden_size, a.rms_norm_eps, False)
