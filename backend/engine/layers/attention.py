"""Attention over the paged KV cache: fused q/k/v projection, optional q/k RMSNorm, RoPE, the
cache write, backend/engine/attention.paged_attention and the output projection.

Each layer is built from an AttentionSpec, the per-layer facts the rest of the engine reads from the model
(the KV pool's heads and head size per layer, windows, soft-caps, sinks). Where the native kernels serve,
a layer's q/k norm (per head or across heads) runs in place on the projection's output (cpu_kernels.qk_norm)
and the RoPE-and-cache-write kernel follows: whole-head, partial (rotary_dim < head_dim) and no RoPE alike,
the calls a captured decode step makes too. Elsewhere the PyTorch path does the same. A spec needing an
attention option that paged_attention does not take is refused when the layer is built (ValueError naming
it), so no model runs with a feature silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from backend.engine import cpu_kernels
from backend.engine.attention import AttentionMetadata, paged_attention, write_kv_cache
from backend.engine.layers.linear import Linear, fold_output_scale
from backend.engine.layers.norm import RMSNorm
from backend.engine.layers.rotary import Rope, RopeSpec, apply_rope

# The keyword options of attention.paged_attention that a layer may pass: its name for each AttentionSpec
# feature. The PyTorch paths, the decode and prefill kernels and the captured decode op take all three.
PAGED_ATTENTION_OPTIONS: frozenset[str] = frozenset({"sliding_window", "soft_cap", "sinks"})


@dataclass(slots=True, frozen=True)
class AttentionSpec:
    """One layer's attention (vLLM's per-layer KV cache spec plus what the layer computes)."""

    num_heads: int
    num_kv_heads: int  # this layer's KV pool: [num_kv_heads, num_blocks, block_size, head_dim]
    head_dim: int
    scale: float  # softmax scale: head_dim ** -0.5 unless the family sets it (Granite's attention_multiplier)
    rope: RopeSpec | None  # None: no RoPE on this layer (SmolLM3's no_rope_layers)
    qk_norm: bool = False  # RMSNorm of q and k before RoPE: per head (Qwen3, Gemma 3)
    qk_norm_across_heads: bool = False  # with qk_norm: one RMSNorm over all heads of q, of k (OLMo 2)
    sliding_window: int | None = None  # attends to the last sliding_window tokens only (Gemma 2/3, gpt-oss)
    logits_soft_cap: float | None = None  # cap * tanh(logits / cap) before softmax (Gemma 2)
    has_sinks: bool = False  # one learned sink logit per head in the softmax (gpt-oss)

    def paged_attention_options(self) -> dict[str, Any]:
        """paged_attention's keyword options this layer needs (sinks: True for the layer's own tensor);
        raises ValueError for one that the attention path does not have yet."""
        wanted: dict[str, Any] = {"sliding_window": self.sliding_window, "soft_cap": self.logits_soft_cap}
        wanted = {name: value for name, value in wanted.items() if value is not None}
        wanted |= {"sinks": True} if self.has_sinks else {}
        missing = sorted(set(wanted) - PAGED_ATTENTION_OPTIONS)
        if missing:
            have = ", ".join(sorted(PAGED_ATTENTION_OPTIONS)) or "none"
            raise ValueError(
                f"This model needs attention feature(s) the engine does not have yet: {', '.join(missing)} "
                f"(supported options: {have}); run it with vLLM or transformers instead"
            )
        return wanted

    @property
    def rotary_dim(self) -> int:
        """Each head's leading elements that RoPE rotates (0: no RoPE on this layer)."""
        return 0 if self.rope is None else self.rope.rotary_dim


class Attention(nn.Module):
    use_kernel = False  # set by CausalLM.prepare_weights: RoPE and the cache write in one cpu_kernels call

    def __init__(self, hidden_size: int, spec: AttentionSpec, bias: tuple[bool, bool], eps: float) -> None:
        """bias: (of the q/k/v projections, of the output projection); eps: the q/k norms'."""
        super().__init__()
        self.spec = spec
        self.options = spec.paged_attention_options()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        self.qkv_proj = Linear(hidden_size, self.q_size + 2 * self.kv_size, bias=bias[0])
        self.o_proj = Linear(self.q_size, hidden_size, bias=bias[1])
        q_width, k_width = (self.q_size, self.kv_size) if spec.qk_norm_across_heads else (spec.head_dim,) * 2
        self.q_norm = RMSNorm(q_width, eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(k_width, eps) if spec.qk_norm else None
        self.sinks = nn.Parameter(torch.zeros(spec.num_heads)) if spec.has_sinks else None
        self.kernel_sinks: torch.Tensor | None = None  # sinks as the kernels read them: [H] fp32 (prepare)
        self.scale = spec.scale
        self.kv_scales = (1.0, 1.0)  # vLLM's k_scale, v_scale for an fp8 KV pool (1.0: no checkpoint scales)
        self.output_scale = (
            1.0  # a factor on o_proj's output not folded into its weight (CausalLM.fold_scales)
        )

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        ropes: Mapping[RopeSpec, Rope],  # this step's rows of every table (RopeTables.at)
        k_cache: torch.Tensor,  # [KVH, num_blocks, block_size, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        rope = None if self.spec.rope is None else ropes[self.spec.rope]
        if self.use_kernel:
            if self.q_norm is not None and self.k_norm is not None:
                cpu_kernels.qk_norm(
                    qkv,
                    self.q_norm.weight,
                    self.k_norm.weight,
                    self.num_heads,
                    self.num_kv_heads,
                    self.spec.qk_norm_across_heads,
                    self.q_norm.eps,
                )
            cpu_kernels.rope_and_cache(
                qkv,
                meta.positions,
                None if rope is None else rope.cos_table,
                None if rope is None else rope.sin_table,
                meta.slot_mapping,
                k_cache,
                v_cache,
                self.num_heads,
                self.kv_scales,
                self.spec.rotary_dim,
            )
            heads = qkv.view(t, -1, self.head_dim)
            q, k, v = heads.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        else:
            q, k, v = self.qkv_heads(qkv, rope)
            write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping, self.kv_scales)
        o = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale, self.kv_scales, **self.options_now())
        out = self.o_proj(o.view(t, self.q_size))
        return out if self.output_scale == 1.0 else out * self.output_scale

    def options_now(self) -> dict[str, Any]:
        """paged_attention's keyword options, the sinks tensor in place of the spec's True."""
        if self.sinks is None:
            return self.options
        return self.options | {"sinks": self.kernel_sinks if self.kernel_sinks is not None else self.sinks}

    def prepare(self) -> None:
        """After loading (CausalLM.prepare_weights): the sinks' fp32 copy that the kernels read in place."""
        if self.sinks is not None:
            self.kernel_sinks = self.sinks.detach().float().contiguous()

    def scale_output(self, factor: float) -> None:
        """This layer's output times factor: in o_proj's weight where it is dense, else at run time."""
        if not fold_output_scale(self.o_proj, factor):
            self.output_scale *= factor

    def qkv_heads(
        self, qkv: torch.Tensor, rope: Rope | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, H, D], k and v [T, KVH, D] of the fused projection's output, q and k normed and rotated."""
        t = qkv.shape[0]
        qk = qkv[:, : self.q_size + self.kv_size]
        if self.q_norm is not None and self.k_norm is not None and self.spec.qk_norm_across_heads:
            qk = torch.cat((self.q_norm(qk[:, : self.q_size]), self.k_norm(qk[:, self.q_size :])), 1)
        qk = qk.reshape(t, -1, self.head_dim)  # q heads, then k heads
        if self.q_norm is not None and self.k_norm is not None and not self.spec.qk_norm_across_heads:
            qk = torch.cat((self.q_norm(qk[:, : self.num_heads]), self.k_norm(qk[:, self.num_heads :])), 1)
        if rope is not None:
            qk = apply_rope(qk, rope.cos, rope.sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        return q, k, v
