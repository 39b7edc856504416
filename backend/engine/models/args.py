"""ModelArgs: a decoder's shape and options as the model classes read them, parsed from a transformers
config (and the checkpoint's weight names, which say which biases and norms exist), validated before
anything is allocated: a config.json is user input, and its sizes decide how much memory the model takes.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from backend.engine.layers.mlp import ACTIVATIONS
from backend.engine.layers.rotary import partial_rotary_factor
from backend.engine.sliding_window import layer_windows

# Upper bounds on a config's sizes: several times the largest public checkpoint's, so that any real model
# passes and a mistyped or hostile config.json fails before allocating. Sources (config.json on the Hub):
# vocab 262,144 (google/gemma-3-27b-it); hidden 16,384, intermediate 53,248, 126 layers, 128 heads
# (meta-llama/Llama-3.1-405B); head_dim 256 (google/gemma-2-27b); 10,485,760 positions
# (meta-llama/Llama-4-Scout-17B-16E).
LIMITS = {
    "vocab_size": 1 << 21,
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 18,
    "num_layers": 1024,
    "num_heads": 1024,
    "num_kv_heads": 1024,
    "head_dim": 1024,
    "rotary_dim": 1024,
    "max_position_embeddings": 1 << 24,
}
HF_NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads"}
HF_NAMES |= {"num_kv_heads": "num_key_value_heads"}  # config.json's names where ours differ (for errors)
FIRST_LAYER = "model.layers.0."


@dataclass(slots=True)
class ModelArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int  # each head's leading dims that RoPE rotates (head_dim unless partial rotary)
    max_position_embeddings: int
    rms_norm_eps: float
    hidden_act: str = "silu"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    attention_scale: float | None = None  # softmax scale; None: head_dim ** -0.5
    # constant factors the model folds into weights where it can (CausalLM.fold_scales)
    embedding_multiplier: float = 1.0  # on the embeddings (Granite's embedding_multiplier)
    residual_multiplier: float = 1.0  # on each attention and MLP output before the residual add (Granite)
    logits_multiplier: float = 1.0  # on the logits (Granite: 1 / logits_scaling)
    # each layer's sliding window, None where it attends fully (sliding_window.layer_windows); () : none
    sliding_windows: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        for name, limit in LIMITS.items():
            value = getattr(self, name)
            if not is_size(value) or value > limit:
                hf_name = HF_NAMES.get(name, name)
                raise ValueError(f"config.json's {hf_name} must be an integer in [1, {limit}], got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_kv_heads})"
            )
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(
                f"the rotary dims ({self.rotary_dim}) must be even and at most head_dim ({self.head_dim})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"Unsupported hidden_act {self.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}"
            )
        self.check_windows()
        floats = ["rms_norm_eps", "embedding_multiplier", "residual_multiplier", "logits_multiplier"]
        for name in [*floats, *(["attention_scale"] if self.attention_scale is not None else [])]:
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"config.json's {name} must be a positive finite number, got {value!r}")

    def check_windows(self) -> None:
        """Each window is a token count within LIMITS, one per layer (or none given at all)."""
        count, limit = len(self.sliding_windows), LIMITS["max_position_embeddings"]
        if count and count != self.num_layers:
            raise ValueError(f"config.json's layer_types has {count} entries for {self.num_layers} layers")
        for window in self.sliding_windows:
            if window is not None and (not is_size(window) or window > limit):
                raise ValueError(
                    f"config.json's sliding_window must be an integer in [1, {limit}], got {window!r}"
                )

    @classmethod
    def from_hf_config(cls, hf_config: Any, weight_names: Collection[str]) -> ModelArgs:
        """The options every Llama-like config spells the same way; biases, q/k norms and an untied lm_head
        as the checkpoint has them (its weight names, transformers' spelling)."""
        hidden_size, heads = hf_config.hidden_size, hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or (
            hidden_size // heads if is_size(hidden_size) and is_size(heads) else 0  # 0: invalid, said below
        )
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            rotary_dim=int(head_dim * partial_rotary_factor(hf_config)) if is_size(head_dim) else 0,
            max_position_embeddings=getattr(hf_config, "max_position_embeddings", None) or 2048,
            rms_norm_eps=hf_config.rms_norm_eps,
            hidden_act=getattr(hf_config, "hidden_act", "silu"),
            qkv_bias=FIRST_LAYER + "self_attn.q_proj.bias" in weight_names,
            o_bias=FIRST_LAYER + "self_attn.o_proj.bias" in weight_names,
            mlp_bias=FIRST_LAYER + "mlp.down_proj.bias" in weight_names,
            qk_norm=FIRST_LAYER + "self_attn.q_norm.weight" in weight_names,
            tie_word_embeddings="lm_head.weight" not in weight_names
            or bool(getattr(hf_config, "tie_word_embeddings", False)),
            # after the layer count is known to be sane (a hostile one would size the tuple)
            sliding_windows=layer_windows(hf_config) if is_layer_count(hf_config.num_hidden_layers) else (),
        )


def is_layer_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= LIMITS["num_layers"]


def is_size(value: object) -> bool:
    """value is a positive int (not a bool): what a config's sizes must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
