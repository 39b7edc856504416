"""Reading a GGUF file's tensors under transformers' names, quantized ones kept as their blocks.

Kept types (gguf_blocks.KEPT_TYPES) stay as bytes; F32/F16 tensors become torch tensors; any other type is
dequantized here, with a log line saying so. llama.cpp stores the q and k projections of "llama" files
with their rows permuted for its RoPE; rows are whole blocks, so the permutation is undone on the blocks,
as transformers undoes it on the dequantized weights.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, dequantize

from backend.engine import gguf_cache
from backend.engine.quantization.gguf_blocks import KEPT_TYPES

log = logging.getLogger(__name__)
PLAIN_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_SKIPPED = ("rope_freqs.weight",)  # llama3 RoPE factors: transformers computes them from the config


@dataclass(slots=True)
class QuantizedWeight:
    qtype: str  # a kernel name from gguf_blocks.KEPT_TYPES
    data: torch.Tensor  # [n, k / block_size * type_size] uint8
    shape: tuple[int, int]  # (n, k) of the weight it encodes


def hf_name(gguf_name: str) -> str:
    match = _LAYER.match(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.{match.group(3)}"
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    raise ValueError(f"unexpected tensor {gguf_name!r} in the GGUF file (not a Llama-family weight)")


def _unpermute(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (transformers' _reverse_permute_weights) on any [n, ...]."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def read_gguf_tensors(
    path: str, hf_config: Any
) -> tuple[dict[str, torch.Tensor], dict[str, QuantizedWeight]]:
    """(plain fp32 tensors, quantized weights) of a GGUF file, by transformers' parameter names."""
    architecture, tensors = gguf_cache.tensors(path)  # the cached table, or one GGUFReader parse
    heads = {"attn_q": hf_config.num_attention_heads}
    heads["attn_k"] = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    plain: dict[str, torch.Tensor] = {}
    quantized: dict[str, QuantizedWeight] = {}
    converted: Counter[str] = Counter()
    for tensor in tensors:
        if tensor.name in _SKIPPED:
            continue
        name, qtype = hf_name(tensor.name), GGMLQuantizationType(tensor.tensor_type)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        if qtype in KEPT_TYPES:
            value = torch.from_numpy(np.array(tensor.data, dtype=np.uint8)).view(shape[0], -1)
        elif qtype in PLAIN_TYPES:
            value = torch.from_numpy(np.array(tensor.data, dtype=np.float32)).reshape(shape)
        else:
            converted[qtype.name] += 1
            value = torch.from_numpy(dequantize(tensor.data, qtype)).reshape(shape)
        kind = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        if architecture == "llama" and kind in heads:
            value = _unpermute(value, heads[kind])
        if qtype in KEPT_TYPES:
            quantized[name] = QuantizedWeight(KEPT_TYPES[qtype], value.contiguous(), (shape[0], shape[1]))
        else:
            plain[name] = value
    for type_name, count in converted.items():
        log.warning(
            "%s: %d %s tensors dequantized at load (kept quantized: %s)",
            path,
            count,
            type_name,
            ", ".join(t.name for t in KEPT_TYPES),
        )
    return plain, quantized
