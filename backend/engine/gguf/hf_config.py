"""A transformers config dict from a GGUF file's metadata, for every architecture in families.FAMILIES.

What the file states is read under llama.cpp's key names (gguf-py/gguf/constants.py Keys); what it does
not state is what llama.cpp's model code assumes (src/models/<family>.cpp), cited where it is used:
sliding-window patterns, SmolLM3's layers without RoPE, Gemma's query scale, the MoE routers' weight
normalisation. Every count is range-checked by metadata.GGUFMetadata before it is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from backend.engine.gguf.families import Family, family_of, sliding_layers
from backend.engine.gguf.metadata import (
    MAX_CONTEXT,
    MAX_EXPERTS,
    MAX_FFN,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_VOCAB,
    GGUFMetadata,
    as_written,
    checked_int,
)

Config = dict[str, Any]


def config_dict(meta: GGUFMetadata) -> Config:
    """The config of the checkpoint the file was converted from, as transformers spells it."""
    has_experts = bool(meta.fields.get(meta.arch_key("expert_count")))
    family = family_of(meta.architecture, has_experts)
    config = _common(meta, family)
    extras = EXTRAS.get(family.model_type)
    return config | extras(meta, config) if extras else config


def _common(meta: GGUFMetadata, family: Family) -> Config:
    hidden = meta.count("embedding_length", 1, MAX_HIDDEN)
    heads = meta.count("attention.head_count", 1, MAX_HEADS)
    head_dim = meta.count("attention.key_length", 1, MAX_HEAD_DIM, default=hidden // heads)
    if meta.count("attention.value_length", 1, MAX_HEAD_DIM, default=head_dim) != head_dim:
        raise ValueError(f"{meta.path}: key and value heads of different widths are not supported")
    vocab = meta.count("vocab_size", 1, MAX_VOCAB, default=meta.fields.get("tokenizer.ggml.tokens"))
    names = meta.tensor_names
    return {
        "model_type": family.model_type,
        "architectures": [family.hf_architecture],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": meta.count("feed_forward_length", 1, MAX_FFN),
        "num_hidden_layers": meta.count("block_count", 1, MAX_LAYERS),
        "num_attention_heads": heads,
        "num_key_value_heads": meta.count("attention.head_count_kv", 1, heads, default=heads),
        "head_dim": head_dim,
        "max_position_embeddings": meta.count("context_length", 1, MAX_CONTEXT),
        "rms_norm_eps": meta.number("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_parameters": _rope(meta, head_dim),
        # llama.cpp writes output.weight only when it is not the embedding
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names or "blk.0.attn_qkv.bias" in names,
        "mlp_bias": "blk.0.ffn_up.bias" in names,
        "bos_token_id": meta.token_id("bos", vocab),
        "eos_token_id": meta.token_id("eos", vocab),
        "pad_token_id": meta.token_id("padding", vocab),
    }


def _rope(meta: GGUFMetadata, head_dim: int) -> Config:
    """rope_parameters from rope.freq_base, rope.dimension_count and rope.scaling.* (TextModel's writer in
    conversion/base.py: linear and yarn only; llama3's factors go into a rope_freqs tensor instead)."""
    params: Config = {"rope_type": "default", "rope_theta": meta.number("rope.freq_base", 10000.0)}
    rotary = meta.count("rope.dimension_count", 2, head_dim, default=head_dim)
    if rotary != head_dim:
        params["partial_rotary_factor"] = rotary / head_dim
    kind = meta.text(meta.arch_key("rope.scaling.type"))
    if kind in (None, "none"):
        return params
    if kind not in ("linear", "yarn"):
        raise ValueError(
            f"{meta.path}: RoPE scaling {kind!r} is not supported; supported: none, linear, yarn"
        )
    params |= {"rope_type": kind, "factor": meta.number("rope.scaling.factor", 1.0)}
    if kind == "yarn":
        original = meta.count("rope.scaling.original_context_length", 1, MAX_CONTEXT)
        params["original_max_position_embeddings"] = original
        optional = {
            "beta_fast": "yarn_beta_fast",
            "beta_slow": "yarn_beta_slow",
            "attention_factor": "yarn_attn_factor",
        }
        for name, key in optional.items():
            if (value := meta.number(f"rope.scaling.{key}")) is not None:
                params[name] = value
    return params


def _layer_types(meta: GGUFMetadata, default_pattern: int | None, layers: int) -> list[str]:
    """attention.sliding_window_pattern (per-layer flags or a period), else llama.cpp's default pattern."""
    value = meta.fields.get(meta.arch_key("attention.sliding_window_pattern"))
    if isinstance(value, list):
        if len(value) != layers:
            raise ValueError(
                f"{meta.path}: sliding_window_pattern has {len(value)} entries for {layers} layers"
            )
        sliding = [bool(flag) for flag in value]
    else:
        key = "sliding_window_pattern"
        pattern = default_pattern if value is None else checked_int(meta.path, key, value, 0, layers)
        sliding = [False] * layers if pattern is None else sliding_layers(pattern, layers)
    return ["sliding_attention" if flag else "full_attention" for flag in sliding]


def _experts(meta: GGUFMetadata, expert_key: str = "num_local_experts") -> Config:
    experts = meta.count("expert_count", 1, MAX_EXPERTS)
    return {expert_key: experts, "num_experts_per_tok": meta.count("expert_used_count", 1, experts)}


def _gemma_scale(config: Config) -> int:
    """query_pre_attn_scalar: llama.cpp's gemma2/gemma3.cpp scale 1/sqrt(hidden / heads) for the 27B models
    (46 and 62 layers), 1/sqrt(head_dim) otherwise."""
    if config["num_hidden_layers"] in (46, 62):
        return config["hidden_size"] // config["num_attention_heads"]
    return config["head_dim"]


def _gemma2(meta: GGUFMetadata, config: Config) -> Config:
    layers = config["num_hidden_layers"]
    return {
        "query_pre_attn_scalar": _gemma_scale(config),
        # gemma2.cpp: n_swa 4096 and soft-caps 50 / 30 (llama-hparams.h) unless the file says otherwise
        "sliding_window": meta.count("attention.sliding_window", 1, MAX_CONTEXT, default=4096),
        "layer_types": _layer_types(meta, 2, layers),
        "attn_logit_softcapping": meta.number("attn_logit_softcapping", 50.0),
        "final_logit_softcapping": meta.number("final_logit_softcapping", 30.0),
    }


def _gemma3(meta: GGUFMetadata, config: Config) -> Config:
    window = meta.count("attention.sliding_window", 0, MAX_CONTEXT, default=0)
    layers = config["num_hidden_layers"]
    # gemma3.cpp: no window means no sliding layers; otherwise every 6th layer is global
    types = _layer_types(meta, 6, layers) if window else ["full_attention"] * layers
    local = {"rope_type": "default", "rope_theta": meta.number("rope.freq_base_swa", 10000.0)}
    return {
        "query_pre_attn_scalar": _gemma_scale(config),
        "sliding_window": window or None,
        "layer_types": types,
        "final_logit_softcapping": meta.number("final_logit_softcapping"),
        "attn_logit_softcapping": None,
        "rope_parameters": {"full_attention": config["rope_parameters"], "sliding_attention": local},
    }


def _phi3(meta: GGUFMetadata, config: Config) -> Config:
    window = meta.count("attention.sliding_window", 0, MAX_CONTEXT, default=0)
    original = meta.count("rope.scaling.original_context_length", 1, MAX_CONTEXT, default=None)
    original = original or config["max_position_embeddings"]
    phi3 = {"sliding_window": window or None, "original_max_position_embeddings": original}
    if "rope_factors_long.weight" not in meta.tensor_names:
        return phi3
    # LongRoPE (Phi-3.5, Phi-4-mini): the converter writes the factors as two tensors (conversion/phi.py)
    rope = config["rope_parameters"] | {"rope_type": "longrope", "original_max_position_embeddings": original}
    return phi3 | {"rope_parameters": rope | _rope_factors(meta, config)}


def _rope_factors(meta: GGUFMetadata, config: Config) -> Config:
    """long_factor / short_factor from rope_factors_long / _short: one per rotary frequency."""
    from gguf import GGUFReader  # only LongRoPE files need their tensor table here

    rope = config["rope_parameters"]
    frequencies = int(config["head_dim"] * rope.get("partial_rotary_factor", 1.0)) // 2
    tensors = GGUFReader(meta.path).tensors  # the header was bounded when the metadata was read
    factors: Config = {}
    for tensor in tensors:
        if tensor.name in ("rope_factors_long.weight", "rope_factors_short.weight"):
            values = np.asarray(tensor.data, dtype=np.float32).ravel()
            if values.size != frequencies or not np.isfinite(values).all():
                raise ValueError(f"{meta.path}: {tensor.name} must hold {frequencies} finite factors")
            kind = tensor.name.removeprefix("rope_factors_").removesuffix(".weight")
            factors[f"{kind}_factor"] = [as_written(float(v)) for v in values]
    if len(factors) != 2:
        raise ValueError(f"{meta.path}: LongRoPE needs both rope_factors_long and rope_factors_short")
    return factors


def _smollm3(meta: GGUFMetadata, config: Config) -> Config:
    # smollm3.cpp: n_no_rope_layer_step = 4, use_rope = (il + 1) % 4 != 0 (1 = uses RoPE, as transformers)
    layers = config["num_hidden_layers"]
    return {"no_rope_layer_interval": 4, "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(layers)]}


def _granite(meta: GGUFMetadata, config: Config) -> Config:
    """The converter writes each *_multiplier only when it is set (conversion/granite.py); granite.cpp
    applies none that is missing, and scales attention by 1/sqrt(head_dim) without attention.scale."""
    if meta.has("expert_shared_feed_forward_length"):
        raise ValueError(f"{meta.path}: Granite MoE with shared experts (granitemoeshared) is not supported")
    return {
        "embedding_multiplier": meta.number("embedding_scale", 1.0),
        "residual_multiplier": meta.number("residual_scale", 1.0),
        "attention_multiplier": meta.number("attention.scale", config["head_dim"] ** -0.5),
        "logits_scaling": meta.number("logit_scale", 1.0),
    }


def _mixtral(meta: GGUFMetadata, config: Config) -> Config:
    return _experts(meta) | {"sliding_window": None}


def _qwen3_moe(meta: GGUFMetadata, config: Config) -> Config:
    # qwen3moe.cpp: build_moe_ffn(..., LLM_FFN_SILU, /* norm_w */ true, ...)
    expert_ffn = meta.count("expert_feed_forward_length", 1, MAX_FFN)
    return _experts(meta) | {"moe_intermediate_size": expert_ffn, "norm_topk_prob": True}


def _olmoe(meta: GGUFMetadata, config: Config) -> Config:
    # olmoe.cpp: build_moe_ffn(..., LLM_FFN_SILU, /* norm_w */ false, ...)
    return _experts(meta, "num_experts") | {
        "norm_topk_prob": False,
        "clip_qkv": meta.number("attention.clamp_kqv"),
    }


def _gpt_oss(meta: GGUFMetadata, config: Config) -> Config:
    rope = config["rope_parameters"]
    if rope["rope_type"] == "yarn":  # gpt-oss's YaRN does not round its correction range (transformers)
        rope = rope | {"truncate": False}
    return _experts(meta) | {
        "intermediate_size": meta.count("expert_feed_forward_length", 1, MAX_FFN),
        "sliding_window": meta.count("attention.sliding_window", 1, MAX_CONTEXT),
        "layer_types": _layer_types(meta, 2, config["num_hidden_layers"]),
        "attention_bias": True,
        "rope_parameters": rope,
    }


EXTRAS: dict[str, Callable[[GGUFMetadata, Config], Config]] = {
    "gemma2": _gemma2,
    "gemma3_text": _gemma3,
    "phi3": _phi3,
    "smollm3": _smollm3,
    "granite": _granite,
    "granitemoe": lambda meta, config: _granite(meta, config) | _experts(meta),
    "mixtral": _mixtral,
    "qwen3_moe": _qwen3_moe,
    "olmoe": _olmoe,
    "gpt_oss": _gpt_oss,
}
