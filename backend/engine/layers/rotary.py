"""Rotary position embeddings: per-layer RopeSpecs, their cos/sin tables, and applying them to q and k.

A layer's RopeSpec says which table it reads and how many of each head's dimensions rotate; layers with
equal specs share one table. Three variants are parameters, not code paths: partial rotary (Phi's
partial_rotary_factor: rotary_dim < head_dim, the rest of each head passes through), one table per layer
type (Gemma 3's local and global theta: layer_type keys config.rope_parameters) and no RoPE on a layer
(SmolLM3's no_rope_layers: the layer's AttentionSpec.rope is None). Tables are computed as transformers
computes them (its ROPE_INIT_FUNCTIONS for the scaled types), in fp32, then cast to the model's dtype.

LongRoPE (Phi-3.5, Phi-4-mini) has two sets of per-frequency factors: transformers picks the long one for
a forward pass whose last position passes original_max_position_embeddings, so a sequence that grows past
it mixes keys of both. Like vLLM (Phi3LongRoPEScaledRotaryEmbedding), the table is fixed per engine: the
long factors when max_model_len passes the original context, else the short ones; so outputs equal
transformers' for sequences within the original context, and for prompts past it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


@dataclass(slots=True, frozen=True)
class RopeSpec:
    rotary_dim: int  # each head's leading dims that rotate: head_dim, or fewer (partial rotary)
    layer_type: str | None = None  # key of this layer's set in config.rope_parameters (None: the one set)


@dataclass(slots=True)
class Rope:
    """One table's rows for one step's positions."""

    cos: torch.Tensor  # [T, 1, rotary_dim]
    sin: torch.Tensor  # [T, 1, rotary_dim], first half negated (folds rotate_half's minus sign in)
    cos_table: torch.Tensor  # [max_positions, rotary_dim], for cpu_kernels.rope_and_cache
    sin_table: torch.Tensor


@dataclass(slots=True)
class RopeTables:
    cos: torch.Tensor  # [max_positions, rotary_dim]
    sin: torch.Tensor

    def at(self, positions: torch.Tensor) -> Rope:  # positions: [T] int64
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return Rope(cos, sin, self.cos, self.sin)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos/sin: [T, 1, R] with sin's first half negated (RopeTables.at), R <= D.

    Equals transformers' x * cos + rotate_half(x) * sin on the first R dims of each head, the other D - R
    passed through (its partial-rotary apply_rotary_pos_emb), exactly.
    """
    rotary_dim = cos.shape[-1]
    rotated, passed = (x, None) if rotary_dim == x.shape[-1] else (x[..., :rotary_dim], x[..., rotary_dim:])
    half = rotary_dim // 2
    rotated = rotated * cos + torch.cat((rotated[..., half:], rotated[..., :half]), dim=-1) * sin
    return rotated if passed is None else torch.cat((rotated, passed), dim=-1)


def rope_parameters(hf_config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The RoPE settings of a layer type: config.rope_parameters (transformers 5), or its per-type entry."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    return dict(params[layer_type] if layer_type is not None else params)


def partial_rotary_factor(hf_config: Any, layer_type: str | None = None) -> float:
    params = rope_parameters(hf_config, layer_type)
    return float(params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0)))


def rope_table(hf_config: Any, spec: RopeSpec, max_positions: int) -> RopeTables:
    """cos/sin [max_positions, spec.rotary_dim] in fp32, computed exactly as transformers does."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # lazy: transformers is slow to import

    params = rope_parameters(hf_config, spec.layer_type)
    rope_type = params.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"Unsupported rope type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        dim = spec.rotary_dim
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        scaling = 1.0
    else:
        kwargs: dict[str, Any] = {} if spec.layer_type is None else {"layer_type": spec.layer_type}
        if rope_type == "longrope":  # long factors where the context may pass the original one (below)
            kwargs["seq_len"] = max_positions
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu", **kwargs)
    if 2 * inv_freq.numel() != spec.rotary_dim:
        raise ValueError(
            f"rope type {rope_type!r} gives {2 * inv_freq.numel()} rotary dims, not {spec.rotary_dim}"
        )
    freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return RopeTables(emb.cos() * scaling, emb.sin() * scaling)


def rope_tables(
    hf_config: Any, specs: Iterable[RopeSpec | None], max_positions: int, like: torch.Tensor
) -> dict[RopeSpec, RopeTables]:
    """One table per distinct spec among specs (None: a layer without RoPE), on like's device and dtype."""
    tables = {}
    for spec in dict.fromkeys(s for s in specs if s is not None):
        table = rope_table(hf_config, spec, max_positions)
        tables[spec] = RopeTables(
            table.cos.to(like.device, like.dtype), table.sin.to(like.device, like.dtype)
        )
    return tables
