"""Installing quantized layers into a model built dense (on the meta device) by the loader."""

from __future__ import annotations

import logging

import torch

from backend.engine.models.base import CausalLM
from backend.engine.quantization.column_tiles import ColumnTiles
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.interleaved import Interleaved
from backend.engine.quantization.quantized_linear import (
    Part,
    QuantizedEmbedding,
    QuantizedLinear,
    Scratch,
    dequantize_part,
)

log = logging.getLogger(__name__)


def install_quantized(model: CausalLM, quantized: dict[str, Part]) -> dict[str, torch.Tensor]:
    """Replace the model's dense layers that quantized (transformers' names) covers with quantized ones.

    A fused layer (model.packed_modules_mapping, e.g. qkv_proj of q_proj, k_proj, v_proj) takes its parts
    in order. Returns the weights it could not keep quantized (a fused layer whose parts are not all
    quantized), dequantized, for the dense path."""
    dtype = model.norm.weight.dtype
    scratch = Scratch()
    names = model.checkpoint_names()
    groups: dict[str, dict[int, tuple[str, Part]]] = {}
    for name, weight in quantized.items():
        found = names.target(name)
        if found is None:
            continue
        own, index = found
        groups.setdefault(own.removesuffix(".weight"), {})[index or 0] = (name, weight)
    leftovers: dict[str, torch.Tensor] = {}
    for path, parts in groups.items():
        weights = [parts[i][1] for i in sorted(parts)]
        if path == "embed_tokens":
            assert isinstance(weights[0], QuantizedWeight), "only GGUF quantizes the embedding"
            embedding: QuantizedWeight | Interleaved | ColumnTiles = weights[0]
            if model.lm_head is None:  # tied: the embedding reads the output projection's bytes
                model.lm_head = QuantizedLinear(weights, False, scratch, dtype)
                (shared,) = model.lm_head.parts  # its layout (interleaved, tiled or not), one copy
                assert isinstance(shared, QuantizedWeight | Interleaved | ColumnTiles)
                embedding = shared
            model.embed_tokens = QuantizedEmbedding(embedding, dtype)
            continue
        parent_path, _, child = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        dense = getattr(parent, child)
        if sum(w.shape[0] for w in weights) != dense.out_features:
            log.warning("%s: only some of its parts are quantized; dequantizing it at load", path)
            leftovers |= {name: dequantize_part(w) for name, w in parts.values()}
            continue
        setattr(parent, child, QuantizedLinear(weights, dense.bias is not None, scratch, dtype))
    return leftovers
