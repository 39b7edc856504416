"""What llama.cpp's converter (convert_hf_to_gguf.py, conversion/*.py) does to each architecture it writes,
as data: the transformers model it came from, the tensors it renamed, reordered or shifted, and where a
mixture-of-experts family keeps its router and experts.

The truth for every entry is the converter and llama.cpp's model code in the llama-cpp-python sdist
(`make llama-cpp-src`): gguf-py/gguf/tensor_mapping.py for names, conversion/<family>.py for what is
changed on the way, src/models/<family>.cpp for hyper-parameters the file does not state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# blk.N.<kind> -> the transformers module under model.layers.N (llama.cpp's tensor_mapping.py, reversed)
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",  # phi3: q, k and v rows fused, as transformers' Phi3 keeps them
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# stacked experts: blk.N.ffn_<p>_exps -> <moe_block>.experts.<p>_proj, [E, n, k] as nn.Linear weights
EXPERT_KINDS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
# llama.cpp's RoPE factor tensors: transformers computes them from the config (rope_parameters)
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


@dataclass(frozen=True, slots=True)
class Family:
    """One llama.cpp architecture as the converter writes it."""

    model_type: str  # transformers' model_type of the source checkpoint
    hf_architecture: str  # its *ForCausalLM class
    permutes_qk: bool = False  # LlamaModel.permute on q/k rows (the LlamaModel subclasses, undo_permute)
    norm_offset: float = 0.0  # added to every *norm.weight (Gemma's RMSNorm scales by 1 + w)
    layer_names: dict[str, str] = field(default_factory=dict)  # overrides of LAYER_NAMES
    moe_block: str = "mlp"  # the transformers module holding the router and the experts
    router: str = "gate"  # blk.N.ffn_gate_inp -> <moe_block>.<router>
    swa_pattern: int | None = None  # llama.cpp's default sliding-window pattern (src/models/<family>.cpp)

    def layer_name(self, kind: str) -> str | None:
        return self.layer_names.get(kind) or LAYER_NAMES.get(kind)


_GEMMA_NAMES = {"ffn_norm": "pre_feedforward_layernorm"}
FAMILIES: dict[str, Family] = {
    # llama.cpp writes Llama, Mistral and Mixtral as "llama" (conversion/llama.py); expert_count says MoE
    "llama": Family("llama", "LlamaForCausalLM", permutes_qk=True),
    "mixtral": Family("mixtral", "MixtralForCausalLM", permutes_qk=True, moe_block="block_sparse_moe"),
    "qwen2": Family("qwen2", "Qwen2ForCausalLM"),
    "qwen3": Family("qwen3", "Qwen3ForCausalLM"),
    "smollm3": Family("smollm3", "SmolLM3ForCausalLM", permutes_qk=True),
    "granite": Family("granite", "GraniteForCausalLM", permutes_qk=True),
    "olmo2": Family("olmo2", "Olmo2ForCausalLM"),
    "phi3": Family("phi3", "Phi3ForCausalLM", layer_names={"ffn_up": "mlp.gate_up_proj"}),
    # gemma2.cpp: load_swa_pattern(ml, 2); gemma3.cpp: load_swa_pattern(ml, 6)
    "gemma2": Family("gemma2", "Gemma2ForCausalLM", norm_offset=1.0, layer_names=_GEMMA_NAMES, swa_pattern=2),
    "gemma3": Family(
        "gemma3_text", "Gemma3ForCausalLM", norm_offset=1.0, layer_names=_GEMMA_NAMES, swa_pattern=6
    ),
    "qwen3moe": Family("qwen3_moe", "Qwen3MoeForCausalLM"),
    "olmoe": Family("olmoe", "OlmoeForCausalLM"),
    "granitemoe": Family(
        "granitemoe",
        "GraniteMoeForCausalLM",
        permutes_qk=True,
        moe_block="block_sparse_moe",
        router="router.layer",
    ),
    # openai-moe.cpp: load_swa_pattern(ml, 2); the attention sinks are one logit per head
    "gpt-oss": Family(
        "gpt_oss",
        "GptOssForCausalLM",
        router="router",
        layer_names={"attn_sinks": "self_attn.sinks"},
        swa_pattern=2,
    ),
}


def family_of(architecture: str, has_experts: bool) -> Family:
    """The Family of a file's general.architecture ("llama" with experts is Mixtral)."""
    if architecture == "llama" and has_experts:
        return FAMILIES["mixtral"]
    if architecture not in FAMILIES:
        raise ValueError(
            f"GGUF architecture {architecture!r} is not supported; supported: {', '.join(sorted(FAMILIES))}"
        )
    return FAMILIES[architecture]


def sliding_layers(pattern: int, layers: int) -> list[bool]:
    """Which layers use the sliding window under llama.cpp's pattern (llama_hparams::set_swa_pattern, not
    dense-first): every pattern-th layer, counting from 1, is full attention; 0 means all slide."""
    return [pattern == 0 or layer % pattern < pattern - 1 for layer in range(layers)]
