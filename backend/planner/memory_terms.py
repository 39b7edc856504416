"""Each term of the memory plan beside how the engine computes it, so a user sees where the memory goes.

For vLLM these are the terms of determine_available_memory (vllm/v1/worker/gpu_worker.py; V0
worker/worker.py): the budget, weights, the profile run's forward pass and sampler (the larger of the two
is the activation peak), non-torch memory, the CUDA-graph estimate (subtracted from 0.21) and what is left
for the KV cache. Other engines get the plan's parts with their engine's rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.planner.catalog import GIB
from backend.planner.memory_plan import Layout, MemoryPlan, vllm_profile_parts
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


def _sampler_how(spec: ModelSpec, lay: Layout, rows: int) -> str:
    limits = lay.limits
    if not rows:
        return "none: no dummy requests are sampled"
    if limits.model_runner_v2:
        path = "Model Runner V2's dummy batch without top-k/top-p: bf16 logits + fp32 copy"
    elif limits.uses_flashinfer_sampler:
        path = "FlashInfer top-k/top-p"
    else:
        path = "vLLM's own top-k/top-p"
    shard = f", 1/{lay.tp} of the rows on each TP rank" if limits.sampler_shards and lay.tp > 1 else ""
    return (
        f"{rows} dummy requests x {spec.vocab_size:,} logits x {limits.sampler_bytes_per_logit:g} bytes, "
        f"{path} (min(max_num_seqs {limits.max_num_seqs}, max_num_batched_tokens "
        f"{limits.max_num_batched_tokens})){shard}"
    )


def _profile_terms(spec: ModelSpec, lay: Layout, plan: MemoryPlan) -> list[MemoryTerm]:
    limits = lay.limits
    parts = vllm_profile_parts(spec, lay)
    peak = "sampler" if parts.sampler > parts.forward else "forward pass"
    terms = [
        MemoryTerm(
            "profile forward pass",
            parts.forward,
            False,
            f"{limits.max_num_batched_tokens} batched tokens x (3 x MLP width / TP + 2 x hidden + q/k/v "
            "width / TP) x 2 bytes",
        ),
        MemoryTerm("profile sampler", parts.sampler, False, _sampler_how(spec, lay, parts.num_reqs)),
    ]
    if parts.sampler_state:
        terms.append(
            MemoryTerm(
                "sampler state",
                parts.sampler_state,
                False,
                f"Model Runner V2's penalty bins: max_num_seqs {limits.max_num_seqs} x {spec.vocab_size:,} x "
                f"{limits.sampler_state_bytes_per_logit:g} bytes, held all along",
            )
        )
    state = " + sampler state" if parts.sampler_state else ""
    terms.append(
        MemoryTerm("activation peak", plan.activation, True, f"the larger of the two ({peak}){state}")
    )
    return terms


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
            "estimated before the KV cache and subtracted (vLLM >= 0.21, Model Runner V1)"
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
