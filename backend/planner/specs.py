"""ModelSpec: the shape of a model that memory and speed depend on, read from a config.json dict.

Parameter counts come from the config by formula (validated against published safetensors totals in
tests/planner/test_planner_specs.py); exact byte figures come from the checkpoint's own tensor tables when we
have them (safetensors headers or a GGUF file).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from backend.engine.sliding_window import layer_windows
from backend.model_limits import check_config

# What each group of weights is, so that a quantization can keep some of them 16-bit. "mtp" is DeepSeek's
# multi-token-prediction layer, which vLLM loads only for MTP speculative decoding.
PARAM_KINDS = ("embedding", "attention", "mlp", "experts", "other", "vision", "mtp")


@dataclass(slots=True)
class ModelSpec:
    name: str
    architecture: str
    model_type: str
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    params_total: int
    params_active: int
    params_by_kind: dict[str, int]
    weights_bytes: int  # as stored in the checkpoint (exact when read from tensor tables)
    checkpoint_dtype: str  # key in quantizations.yaml describing the stored weights ("bf16", "mxfp4", ...)
    weights_exact: bool = False  # True when weights_bytes was summed from the checkpoint's tensor table
    tie_word_embeddings: bool = False
    attention: str = "gqa"  # "mha" | "gqa" | "mqa" | "mla"
    sliding_window: int | None = None
    layer_types: list[str] = field(default_factory=list)  # "full_attention" | "sliding_attention"
    partial_rotary_factor: float = 1.0  # the share of each head RoPE rotates (Phi-4-mini: 0.75)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    source: str = ""

    @property
    def num_sliding_layers(self) -> int:
        return sum(t == "sliding_attention" for t in self.layer_types)

    def to_dict(self) -> dict:
        return asdict(self)


def _text_config(config: dict) -> dict:
    """Multimodal configs (Gemma 3, Llama 4, ...) nest the language model's fields in text_config."""
    text = config.get("text_config")
    if not text:
        return config
    return {**{k: v for k, v in config.items() if k != "text_config"}, **text}


def _layer_types(c: dict, layers: int) -> list[str]:
    """Each layer's attention as the embedded engine reads it (backend/engine/sliding_window.layer_windows:
    layer_types, else sliding_window_pattern or the model type's default, Qwen2's max_window_layers, else
    sliding_window on every layer), layer_types cut to the layers that hold KV."""
    if c.get("layer_types"):
        return [t if t == "sliding_attention" else "full_attention" for t in c["layer_types"]][:layers]
    windows = layer_windows({**c, "num_hidden_layers": layers})
    return ["full_attention" if window is None else "sliding_attention" for window in windows]


def _partial_rotary_factor(c: dict) -> float:
    """rope_parameters' (transformers 5) or rope_scaling's, else the config's own, as the engine reads it
    (backend/engine/layers/rotary.py)."""
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    return float(rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))


def _attention_params(c: dict, hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    if c.get("kv_lora_rank"):  # MLA (DeepSeek-V2/V3)
        nope, rope, v_dim = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        q_lora, kv_lora = c.get("q_lora_rank"), c["kv_lora_rank"]
        q = (
            hidden * q_lora + q_lora + q_lora * heads * (nope + rope)
            if q_lora
            else hidden * heads * (nope + rope)
        )
        kv = hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
        return q + kv + heads * v_dim * hidden
    q, kv = heads * head_dim, kv_heads * head_dim
    params = hidden * (q + 2 * kv) + q * hidden
    if c.get("attention_bias") or c.get("model_type") in ("qwen2", "qwen2_moe"):
        params += q + 2 * kv  # q/k/v biases
        if c.get("attention_bias"):
            params += hidden  # o_proj bias (gpt-oss, ...)
    if c.get("model_type") in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"):
        params += 2 * head_dim  # q_norm, k_norm
    if c.get("model_type") == "olmoe":
        params += q + kv  # q_norm, k_norm over the whole projections
    if c.get("model_type") == "gpt_oss":
        params += heads  # attention sinks
    return params


def _moe_params(c: dict, hidden: int) -> tuple[int, int]:
    """(routed expert weights, router + shared experts) of one MoE layer."""
    experts = c.get("num_local_experts") or c.get("n_routed_experts") or c.get("num_experts")
    assert experts, "only called for MoE layers (_is_moe_layer), whose config names the expert count"
    inter = c.get("moe_intermediate_size") or c["intermediate_size"]
    routed = experts * 3 * hidden * inter
    other = experts * hidden  # router
    if c.get("model_type") == "gpt_oss":
        routed += experts * (2 * inter + hidden)  # expert biases
        other += experts  # router bias
    if c.get("topk_method") == "noaux_tc":
        other += experts  # e_score_correction_bias
    if c.get("n_shared_experts"):
        other += c["n_shared_experts"] * 3 * hidden * inter
    if c.get("shared_expert_intermediate_size"):
        other += 3 * hidden * c["shared_expert_intermediate_size"] + hidden
    return routed, other


def _is_moe_layer(c: dict, i: int) -> bool:
    if not (c.get("num_local_experts") or c.get("n_routed_experts") or c.get("num_experts")):
        return False
    if i in (c.get("mlp_only_layers") or []):  # Qwen2/3-MoE: dense layers by index
        return False
    step = c.get("decoder_sparse_step") or 1  # Qwen2/3-MoE: every step-th layer is sparse
    sparse = i >= c.get("first_k_dense_replace", 0) and i % c.get("moe_layer_freq", 1) == 0
    return sparse and (i + 1) % step == 0


def _add_layer(
    kinds: dict, c: dict, i: int, hidden: int, heads: int, kv_heads: int, head_dim: int, norms: int
):
    kinds["attention"] += _attention_params(c, hidden, heads, kv_heads, head_dim)
    kinds["other"] += norms * hidden
    if _is_moe_layer(c, i):
        routed, other = _moe_params(c, hidden)
        kinds["experts"] += routed
        kinds["other"] += other
    else:
        kinds["mlp"] += 3 * hidden * c["intermediate_size"]


def count_params(config: dict) -> dict[str, int]:
    """Parameters per kind (see PARAM_KINDS) from a Hugging Face config.json dict."""
    c = _text_config(config)
    hidden, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    norms_per_layer = 4 if c.get("model_type", "").startswith("gemma") else 2
    kinds = dict.fromkeys(PARAM_KINDS, 0)
    tied = c.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    kinds["embedding"] = vocab * hidden * (1 if tied else 2)
    kinds["other"] = hidden  # final norm
    for i in range(layers):
        _add_layer(kinds, c, i, hidden, heads, kv_heads, head_dim, norms_per_layer)
    for _ in range(c.get("num_nextn_predict_layers", 0)):
        mtp = dict.fromkeys(PARAM_KINDS, 0)
        _add_layer(mtp, c, layers - 1, hidden, heads, kv_heads, head_dim, norms_per_layer)
        # plus its own norms, hidden/embedding projection, embedding and head copies
        kinds["mtp"] += sum(mtp.values()) + 3 * hidden + 2 * hidden * hidden + 2 * vocab * hidden
    if config.get("vision_config"):
        kinds["vision"] = _siglip_params(config["vision_config"]) + _projector_params(config, hidden)
    return kinds


def _siglip_params(v: dict) -> int:
    hidden, inter, patch = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    patches = (v["image_size"] // patch) ** 2
    layer = 4 * (hidden * hidden + hidden) + 2 * hidden * inter + inter + hidden + 4 * hidden
    return (
        3 * patch * patch * hidden + hidden + patches * hidden + v["num_hidden_layers"] * layer + 2 * hidden
    )


def _projector_params(config: dict, text_hidden: int) -> int:
    vision_hidden = config["vision_config"]["hidden_size"]
    return vision_hidden + vision_hidden * text_hidden  # Gemma 3: soft-embedding norm + input projection


def spec_from_config(
    config: dict,
    name: str,
    source: str,
    params: dict[str, int] | None = None,
    weights_bytes: int | None = None,
    checkpoint_dtype: str | None = None,
) -> ModelSpec:
    """Build a ModelSpec; params/weights_bytes from a tensor table override the formula when given."""
    check_config(config)  # a stranger's config: every count in range before anything is computed from it
    c = _text_config(config)
    kinds = params or count_params(config)
    total = sum(kinds.values())
    experts = c.get("num_local_experts") or c.get("n_routed_experts") or c.get("num_experts") or 0
    top_k = c.get("num_experts_per_tok") or c.get("num_experts_per_token") or 0
    inactive_experts = kinds["experts"] * (experts - top_k) // experts if experts else 0
    active = total - kinds["vision"] - kinds["mtp"] - inactive_experts
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    if c.get("kv_lora_rank"):
        attention = "mla"
    else:
        attention = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"
    dtype = checkpoint_dtype or _checkpoint_dtype(config)
    layers = c["num_hidden_layers"]
    return ModelSpec(
        name=name,
        architecture=(config.get("architectures") or [c.get("model_type", "unknown")])[0],
        model_type=c.get("model_type", ""),
        num_hidden_layers=layers,
        hidden_size=c["hidden_size"],
        intermediate_size=c.get("intermediate_size", 0),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        vocab_size=c["vocab_size"],
        max_position_embeddings=c.get("max_position_embeddings", 2048),
        params_total=total,
        params_active=active,
        params_by_kind=kinds,
        weights_bytes=weights_bytes if weights_bytes is not None else total * 2,
        checkpoint_dtype=dtype,
        weights_exact=weights_bytes is not None,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        attention=attention,
        sliding_window=c.get("sliding_window") if c.get("use_sliding_window") is not False else None,
        layer_types=_layer_types(c, layers),
        partial_rotary_factor=_partial_rotary_factor(c),
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=c.get("moe_intermediate_size") or (c["intermediate_size"] if experts else 0),
        kv_lora_rank=c.get("kv_lora_rank") or 0,
        qk_rope_head_dim=c.get("qk_rope_head_dim", 0) if c.get("kv_lora_rank") else 0,
        source=source,
    )


def _checkpoint_dtype(config: dict) -> str:
    quant_config = config.get("quantization_config") or {}
    quant = quant_config.get("quant_method")
    if quant == "gptq" and quant_config.get("bits") == 8:
        return "gptq-int8-g128"
    if quant == "gptq" and quant_config.get("group_size") == 32:
        return "gptq-int4-g32"
    if quant == "compressed-tensors":  # one weight scheme for all groups (what the embedded engine runs)
        groups = list((quant_config.get("config_groups") or {}).values())
        weights = (groups[0].get("weights") if groups else None) or {}
        if quant_config.get("format") == "float-quantized":
            return "fp8"
        return {4: "gptq-int4-g128", 8: "gptq-int8-g128"}.get(int(weights.get("num_bits") or 0), str(quant))
    if quant:
        return {"fp8": "fp8", "mxfp4": "mxfp4", "awq": "awq-int4", "gptq": "gptq-int4-g128"}.get(quant, quant)
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return {"float16": "fp16", "float32": "fp32"}.get(dtype, "bf16")
