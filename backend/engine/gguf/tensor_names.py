"""A GGUF tensor's transformers parameter name, per llama.cpp architecture (families.Family).

Dense weights get the name the transformers checkpoint has (phi3's fused qkv_proj and gate_up_proj
included, as transformers' Phi3 keeps them). A mixture-of-experts layer's experts stay stacked as the file
stores them, one tensor per projection: <moe_block>.experts.{gate,up,down}_proj ([E, n, k], each expert an
nn.Linear weight [out, in]) and their biases <moe_block>.experts.{gate,up,down}_proj_bias ([E, n], gpt-oss);
the router keeps the family's name (mixtral block_sparse_moe.gate, qwen3_moe / olmoe mlp.gate, granitemoe
block_sparse_moe.router.layer, gpt_oss mlp.router).
"""

from __future__ import annotations

import re

from backend.engine.gguf.families import EXPERT_KINDS, GLOBAL_NAMES, Family

_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
BARE_PARAMETERS = ("attn_sinks",)  # blk.N.<kind>.weight is a parameter of the attention, not a module


def layer_kind(gguf_name: str) -> str:
    """attn_q, ffn_gate_exps, ... of a blk.N.* tensor; "" for the embedding, output and final norm."""
    match = _LAYER.match(gguf_name)
    return match.group(2) if match else ""


def hf_name(family: Family, gguf_name: str) -> str:
    match = _LAYER.match(gguf_name)
    if match is None:
        stem, _, suffix = gguf_name.rpartition(".")
        if stem in GLOBAL_NAMES and suffix == "weight":
            return f"{GLOBAL_NAMES[stem]}.{suffix}"
        raise ValueError(f"unexpected tensor {gguf_name!r} in a {family.model_type} GGUF file")
    layer, kind, suffix = match.groups()
    prefix = f"model.layers.{layer}."
    if kind in EXPERT_KINDS:
        stacked = f"{prefix}{family.moe_block}.experts.{EXPERT_KINDS[kind]}"
        return stacked if suffix == "weight" else f"{stacked}_bias"
    if kind == "ffn_gate_inp":
        return f"{prefix}{family.moe_block}.{family.router}.{suffix}"
    module = family.layer_name(kind)
    if module is None:
        raise ValueError(f"unexpected tensor {gguf_name!r} in a {family.model_type} GGUF file")
    return prefix + module if kind in BARE_PARAMETERS else f"{prefix}{module}.{suffix}"
