"""DecoderLayer: the pre-norm block (norm -> attention -> add -> norm -> MLP) of Llama and most families.

The residual stream's adds are fused into the next norm (vLLM's layout): a layer returns its MLP output
and the stream before it, and the next layer's input norm (or the model's final one) adds the pair. The
captured decode step walks exactly this structure (decode_graph.py). SandwichDecoderLayer norms each
sublayer's output before its residual add (OLMo 2: those norms only; Gemma 2/3: and the pre-norms too); it
keeps the same (output, residual) convention and runs eagerly until the graph learns it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from backend.engine.attention import AttentionMetadata
from backend.engine.layers.attention import Attention
from backend.engine.layers.norm import RMSNorm
from backend.engine.layers.rotary import Rope, RopeSpec


class DecoderLayer(nn.Module):
    def __init__(self, self_attn: Attention, mlp: nn.Module, hidden_size: int, eps: float) -> None:
        """mlp: a GatedMLP, or a family's own block (an MoE one) with the same forward(x)."""
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]: the previous layer's MLP output (the embeddings for the first)
        residual: torch.Tensor | None,  # [T, hidden]: the stream before x (None for the first layer)
        ropes: Mapping[RopeSpec, Rope],
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it); the caller adds the last pair."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        h = self.self_attn(h, ropes, k_cache, v_cache, meta)
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        return self.mlp(h), residual


class SandwichDecoderLayer(nn.Module):
    """stream += post_attention_norm(attn(pre(stream))); stream += post_feedforward_norm(mlp(pre(stream))),
    pre being input_layernorm / pre_feedforward_layernorm where pre_norms (Gemma 2/3), else nothing (OLMo 2).
    Returns (the MLP's normed output, the stream before it), as DecoderLayer does."""

    def __init__(
        self, self_attn: Attention, mlp: nn.Module, hidden_size: int, eps: float, pre_norms: bool
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden_size, eps) if pre_norms else None
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)
        self.pre_feedforward_layernorm = RMSNorm(hidden_size, eps) if pre_norms else None
        self.post_feedforward_layernorm = RMSNorm(hidden_size, eps)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]: the previous layer's normed MLP output (the embeddings for the first)
        residual: torch.Tensor | None,  # [T, hidden]: the stream before x (None for the first layer)
        ropes: Mapping[RopeSpec, Rope],
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stream = x if residual is None else x + residual
        h = stream if self.input_layernorm is None else self.input_layernorm(stream)
        h = self.post_attention_layernorm(self.self_attn(h, ropes, k_cache, v_cache, meta))
        if self.pre_feedforward_layernorm is None:
            stream = stream + h
            h = stream
        else:
            h, stream = self.pre_feedforward_layernorm.add_forward(h, stream)
        return self.post_feedforward_layernorm(self.mlp(h)), stream
