"""Each term of the memory plan beside how the engine computes it, so a user sees where the memory goes.

For vLLM these are the terms of determine_available_memory (vllm/v1/worker/gpu_worker.py; V0
worker/worker.py): the budget, weights, the profile run's forward pass and sampler (the larger of the two
is the activation peak), non-torch memory, the CUDA-graph estimate (subtracted from 0.21) and what is left
for the KV cache. Other engines get the plan's parts with their engine's rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.planner import memory
from backend.planner.catalog import GIB
from backend.planner.memory_plan import Layout, MemoryPlan
from backend.planner.request import PlanRequest
from backend.planner.specs import ModelSpec
from backend.planner.vllm_rules import custom_all_reduce


@dataclass(slots=True, frozen=True)
class MemoryTerm:
    """One figure per GPU: its name as vLLM logs it, bytes, whether it comes out of the KV budget, and
    how it was computed (with the numbers)."""

    name: str
    bytes: int
    subtracted: bool
    how: str


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB"


def _profile_terms(spec: ModelSpec, lay: Layout, plan: MemoryPlan) -> list[MemoryTerm]:
    limits = lay.limits
    tokens = limits.max_num_batched_tokens
    num_reqs = 0 if (not limits.is_v1 and limits.chunked_prefill) else min(limits.max_num_seqs, tokens)
    forward = memory.forward_activation_bytes(spec, tokens, lay.tp)
    per_logit = limits.sampler_bytes_per_logit
    sampler = memory.sampler_bytes(spec, num_reqs, per_logit)
    path = "FlashInfer top-k/top-p" if limits.uses_flashinfer_sampler else "vLLM's own top-k/top-p"
    sampler_how = (
        f"{num_reqs} dummy requests x {spec.vocab_size:,} logits x {per_logit:g} bytes, {path} "
        f"(min(max_num_seqs {limits.max_num_seqs}, max_num_batched_tokens {tokens}); gathered whole on "
        "every TP rank)"
        if num_reqs
        else "none: V0 with chunked prefill profiles the forward pass only"
    )
    peak = "sampler" if sampler > forward else "forward pass"
    return [
        MemoryTerm(
            "profile forward pass",
            forward,
            False,
            f"{tokens} batched tokens x (3 x MLP width / TP + 2 x hidden) x 2 bytes",
        ),
        MemoryTerm("profile sampler", sampler, False, sampler_how),
        MemoryTerm("activation peak", plan.activation, True, f"the larger of the two ({peak})"),
    ]


def vllm_terms(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan) -> list[MemoryTerm]:
    """The terms of vLLM's KV budget for this version family, in the order vLLM subtracts them."""
    fam = lay.limits.family
    budget = int(lay.gpu.usable_bytes * req.gpu_memory_utilization)
    graphs_in = lay.limits.subtracts_cuda_graphs
    link = (
        "NVLink, custom all-reduce"
        if custom_all_reduce(lay.gpu, req.disable_custom_all_reduce)
        else "NCCL only (no NVLink, or custom all-reduce off)"
    )
    return [
        MemoryTerm(
            "budget",
            budget,
            False,
            f"{_gib(lay.gpu.usable_bytes)} x gpu_memory_utilization {req.gpu_memory_utilization}",
        ),
        MemoryTerm("weights", plan.weights, True, f"{lay.quant.name} weights / (TP {lay.tp} x PP {req.pp})"),
        *_profile_terms(spec, lay, plan),
        MemoryTerm(
            "non-torch",
            plan.overhead,
            True,
            f"vLLM {fam.name}, TP={lay.tp} PP={req.pp}, {link}",
        ),
        MemoryTerm(
            "CUDA graphs",
            plan.cuda_graphs,
            graphs_in,
            "estimated before the KV cache and subtracted (vLLM >= 0.21)"
            if graphs_in
            else "captured after the KV cache: outside gpu_memory_utilization's budget",
        ),
        MemoryTerm("KV cache", plan.kv_cache, False, "what is left, floored to whole blocks"),
    ]


def plan_terms(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan) -> list[MemoryTerm]:
    """vLLM's terms, or the plan's parts for the other engines."""
    if req.engine == "vllm":
        return vllm_terms(req, spec, lay, plan)
    rule = f"{req.engine}'s accounting (memory.kv_budget_bytes)"
    return [
        MemoryTerm("weights", plan.weights, True, f"{lay.quant.name} weights / (TP {lay.tp} x PP {req.pp})"),
        MemoryTerm("activation peak", plan.activation, True, rule),
        MemoryTerm("non-torch", plan.overhead, True, rule),
        MemoryTerm("CUDA graphs", plan.cuda_graphs, req.engine == "embedded", rule),
        MemoryTerm("KV cache", plan.kv_cache, False, rule),
    ]
