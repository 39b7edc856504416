"""MoEConfig: what a mixture-of-experts block computes, read from a transformers config by family.

The families differ in data only (transformers 5.24's modeling files):
  mixtral, qwen2_moe, qwen3_moe, olmoe: softmax over all experts in fp32, then the top_k (Mixtral renormalises
    them; the others when norm_topk_prob says so); SiLU-and-multiply experts
  granitemoe(shared), gpt_oss: the top_k logits, then a softmax over those
  gpt_oss: a router bias, expert biases, the clamped SwiGLU (alpha, limit) over alternating gate / up columns
  qwen2_moe: a shared expert whose output is scaled by sigmoid(shared_expert_gate(x)); granitemoeshared: a
    shared expert added as it is
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Scoring = Literal["softmax_topk", "topk_softmax"]  # softmax over all, then top-k; or top-k logits, softmax
Activation = Literal["silu", "swigluoai"]  # vLLM's names: SiLU-and-multiply; gpt-oss's clamped SwiGLU
MAX_EXPERTS, MAX_TOP_K = 1024, 64  # csrc/moe.cpp's routing buffers


@dataclass(frozen=True, slots=True)
class MoEFamily:
    """Where a family's config keeps its MoE numbers, and the routing its modeling file computes."""

    scoring: Scoring
    intermediate_attr: str  # the per-expert intermediate size
    renormalize: bool | None = None  # None: config.norm_topk_prob says
    activation: Activation = "silu"
    has_biases: bool = False  # router and expert biases (gpt-oss)
    shared_attr: str | None = None  # the shared expert's intermediate size
    has_shared_gate: bool = False  # the shared expert's output times sigmoid(shared_expert_gate(x))


FAMILIES = {  # transformers model_type -> its MoE block
    "mixtral": MoEFamily("softmax_topk", "intermediate_size", renormalize=True),
    "qwen2_moe": MoEFamily(
        "softmax_topk",
        "moe_intermediate_size",
        shared_attr="shared_expert_intermediate_size",
        has_shared_gate=True,
    ),
    "qwen3_moe": MoEFamily("softmax_topk", "moe_intermediate_size"),
    "olmoe": MoEFamily("softmax_topk", "intermediate_size"),
    "granitemoe": MoEFamily("topk_softmax", "intermediate_size", renormalize=False),
    "granitemoeshared": MoEFamily(
        "topk_softmax", "intermediate_size", renormalize=False, shared_attr="shared_intermediate_size"
    ),
    "gpt_oss": MoEFamily(
        "topk_softmax", "intermediate_size", renormalize=False, activation="swigluoai", has_biases=True
    ),
}


@dataclass(frozen=True, slots=True)
class MoEConfig:
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int  # each expert's
    scoring: Scoring = "softmax_topk"
    renormalize: bool = False
    activation: Activation = "silu"
    router_bias: bool = False
    expert_bias: bool = False
    shared_intermediate_size: int = 0  # 0: no shared expert
    shared_expert_gate: bool = False
    swiglu_alpha: float = 1.702  # gpt-oss's (GptOssConfig.swiglu_alpha)
    swiglu_limit: float = 7.0  # GptOssConfig.swiglu_limit
    gpt_oss_layout: bool = False  # fused checkpoint tensors [E, k, n] with gate / up columns alternating

    def __post_init__(self) -> None:
        if not 1 <= self.num_experts <= MAX_EXPERTS or not 1 <= self.top_k <= min(
            self.num_experts, MAX_TOP_K
        ):
            raise ValueError(
                f"a MoE block takes 1-{MAX_EXPERTS} experts and top_k in 1..min(experts, {MAX_TOP_K}), got "
                f"{self.num_experts} experts, top_k {self.top_k}"
            )


def moe_config(hf_config: Any) -> MoEConfig:
    """The MoE block of a transformers config of one of FAMILIES (ValueError for any other)."""
    family = FAMILIES.get(hf_config.model_type)
    if family is None:
        raise ValueError(
            f"no MoE block for model_type {hf_config.model_type!r}; known: {', '.join(FAMILIES)}"
        )
    if family.activation == "silu" and getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"MoE experts take hidden_act 'silu', got {hf_config.hidden_act!r}")
    experts = getattr(hf_config, "num_local_experts", None) or hf_config.num_experts
    renormalize = family.renormalize
    return MoEConfig(
        num_experts=experts,
        top_k=hf_config.num_experts_per_tok,
        hidden_size=hf_config.hidden_size,
        intermediate_size=getattr(hf_config, family.intermediate_attr),
        scoring=family.scoring,
        renormalize=bool(hf_config.norm_topk_prob) if renormalize is None else renormalize,
        activation=family.activation,
        router_bias=family.has_biases,
        expert_bias=family.has_biases,
        shared_intermediate_size=getattr(hf_config, family.shared_attr, 0) if family.shared_attr else 0,
        shared_expert_gate=family.has_shared_gate,
        swiglu_alpha=getattr(hf_config, "swiglu_alpha", 1.702),
        swiglu_limit=getattr(hf_config, "swiglu_limit", 7.0),
        gpt_oss_layout=family.activation == "swigluoai",
    )
