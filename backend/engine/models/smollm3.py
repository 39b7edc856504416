"""SmolLM3 (HuggingFaceTB/SmolLM3-3B): Llama's decoder where some layers skip RoPE ("NoPE"):
config.no_rope_layers holds 1 for a layer that rotates q and k, 0 for one that does not (every 4th by
default). A NoPE layer's AttentionSpec has rope=None. Its sliding windows (use_sliding_window with
layer_types) go into the layers' specs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from backend.engine.layers.attention import AttentionSpec
from backend.engine.models.base import CausalLM


class SmolLM3ForCausalLM(CausalLM):
    def attention_spec(self, layer: int) -> AttentionSpec:
        config, layers = self.config, self.args.num_layers
        uses_rope = layer_flags(config, "no_rope_layers", layers)[layer]
        types = getattr(config, "layer_types", None) or ["full_attention"] * layers
        sliding = bool(getattr(config, "use_sliding_window", False)) and types[layer] == "sliding_attention"
        spec = super().attention_spec(layer)
        return replace(
            spec,
            rope=spec.rope if uses_rope else None,
            sliding_window=config.sliding_window if sliding else None,
        )


def layer_flags(config: Any, name: str, num_layers: int) -> list[bool]:
    """config.<name> as one flag per layer; ValueError unless it is a list of num_layers 0 / 1 values."""
    values = getattr(config, name, None)
    if not isinstance(values, list) or len(values) != num_layers or any(v not in (0, 1) for v in values):
        raise ValueError(f"config.json's {name} must be a list of {num_layers} values 0 or 1, got {values!r}")
    return [bool(v) for v in values]
