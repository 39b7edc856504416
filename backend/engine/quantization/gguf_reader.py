"""Reading a GGUF file's tensors under transformers' names, quantized ones kept as their blocks.

Kept types (gguf_blocks.STORED_TYPES: the CPU kernels' types and MXFP4) stay as bytes; F32/F16 tensors
become torch tensors; any other type is dequantized here, with a log line saying so. Names follow
gguf/tensor_names.py; what llama.cpp's converter changed on the way is undone per architecture
(gguf/families.py): the q/k rows it permuted for its RoPE (LlamaModel subclasses; rows are whole blocks,
so the permutation is undone on the blocks, as transformers undoes it on the dequantized weights) and the
1 it added to Gemma's norm weights.

Stacked experts ([E, n, k] in the file) come out as one tensor per projection: a float [E, n, k], or a
QuantizedWeight whose data is [E * n, row_bytes] (expert e's rows are e * n .. e * n + n - 1) and whose
shape is (E * n, k).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, dequantize

from backend.engine import gguf_cache
from backend.engine.gguf.families import ROPE_TENSORS, Family, family_of
from backend.engine.gguf.tensor_names import hf_name, layer_kind
from backend.engine.quantization.gguf_blocks import STORED_TYPES as KEPT_TYPES
from backend.engine.quantization.gguf_blocks import dequantize as dequantize_blocks

log = logging.getLogger(__name__)
PLAIN_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16)


@dataclass(slots=True)
class QuantizedWeight:
    qtype: str  # a name from gguf_blocks.STORED_TYPES (q4_0, ..., mxfp4)
    data: torch.Tensor  # [n, k / block_size * type_size] uint8 (n = E * rows for stacked experts)
    shape: tuple[int, int]  # (n, k) of the weight it encodes


def _unpermute(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (transformers' _reverse_permute_weights) on any [n, ...]."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def _value(
    tensor: gguf_cache.GGUFTensor, qtype: GGMLQuantizationType, shape: tuple[int, ...]
) -> torch.Tensor:
    """Kept types: [rows, row_bytes] uint8 (rows = all but the last dimension); the rest: float32 of shape."""
    if qtype in KEPT_TYPES:
        rows = math.prod(shape[:-1])
        return torch.from_numpy(np.array(tensor.data, dtype=np.uint8)).view(rows, -1)
    if qtype in PLAIN_TYPES:
        return torch.from_numpy(np.array(tensor.data, dtype=np.float32)).reshape(shape)
    return torch.from_numpy(dequantize(tensor.data, qtype)).reshape(shape)


def _undo_conversion(
    family: Family, gguf_name: str, value: torch.Tensor, heads: dict[str, int]
) -> torch.Tensor:
    kind = layer_kind(gguf_name)
    if family.permutes_qk and kind in heads:
        value = _unpermute(value, heads[kind])
    if family.norm_offset and gguf_name.endswith("norm.weight"):
        value = value - family.norm_offset
    return value


def read_gguf_tensors(
    path: str, hf_config: Any, keep_blocks: bool = True
) -> tuple[dict[str, torch.Tensor], dict[str, QuantizedWeight]]:
    """(plain fp32 tensors, quantized weights) of a GGUF file, by transformers' parameter names; with
    keep_blocks=False every tensor is plain, kept types decoded (gguf_blocks) to the file's shape."""
    architecture, tensors = gguf_cache.tensors(path)  # the cached table, or one GGUFReader parse
    family = family_of(architecture, any(t.name.endswith("_exps.weight") for t in tensors))
    heads = {"attn_q": hf_config.num_attention_heads}
    heads["attn_k"] = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    plain: dict[str, torch.Tensor] = {}
    quantized: dict[str, QuantizedWeight] = {}
    converted: Counter[str] = Counter()
    for tensor in tensors:
        if tensor.name in ROPE_TENSORS:
            continue
        name, qtype = hf_name(family, tensor.name), GGMLQuantizationType(tensor.tensor_type)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        if qtype not in KEPT_TYPES and qtype not in PLAIN_TYPES:
            converted[qtype.name] += 1
        value = _undo_conversion(family, tensor.name, _value(tensor, qtype, shape), heads)
        if qtype in KEPT_TYPES and keep_blocks:
            rows = value.shape[0]
            quantized[name] = QuantizedWeight(KEPT_TYPES[qtype], value.contiguous(), (rows, shape[-1]))
        elif qtype in KEPT_TYPES:
            plain[name] = dequantize_blocks(value, KEPT_TYPES[qtype]).reshape(shape)
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
