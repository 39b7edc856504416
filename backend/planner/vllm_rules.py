"""The rules by which vLLM sizes its KV cache, per vLLM version: scheduler defaults and what it subtracts.

The planner models the vLLM version the export targets (VLLM_TARGET_VERSION); a PlanRequest may name
another (vllm_version). Every rule below names the vLLM source it follows; tests/data/vllm_logs.yaml
holds the published startup logs it is checked against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from backend.errors import UserError
from backend.planner import vllm_versions
from backend.planner.catalog import GIB, GPU, get_gpu
from backend.planner.request import PlanRequest
from backend.planner.vllm_versions import FAMILIES, VllmFamily, family_for

# The version backend/export/vllm.py writes launch files for (tests/planner/test_planner_vllm.py checks
# they agree).
VLLM_TARGET_VERSION = "0.33.0"
# vllm/engine/arg_utils.py EngineArgs.get_batch_defaults: on a GPU with >= 70 GiB that is not an A100
# (from 0.9, vllm_versions.VllmFamily.large_gpu_defaults), 16384 (LLM class) / 8192 (API server) batched
# tokens and 1024 sequences; otherwise 8192 / 2048 tokens and 256 sequences.
LARGE_GPU_BYTES = 70 * GIB
V1_BATCHED_TOKENS = {"llm_class": 8192, "openai_api_server": 2048}
V1_BATCHED_TOKENS_LARGE = {"llm_class": 16384, "openai_api_server": 8192}
V1_MAX_NUM_SEQS, V1_MAX_NUM_SEQS_LARGE = 256, 1024
# V0 (vllm/config.py SchedulerConfig, 0.6-0.10): 256 sequences; chunked prefill is switched on for
# max_model_len > 32K (EngineArgs.create_engine_config, use_long_context) with a 2048-token budget
# (_DEFAULT_MAX_NUM_BATCHED_TOKENS; 512 before 0.6.5); without it the budget is max(max_model_len, 2048).
V0_MAX_NUM_SEQS = 256
V0_LONG_CONTEXT = 32 * 1024
V0_CHUNKED_BATCHED_TOKENS = 2048
# vllm/engine/arg_utils.py _is_v1_supported_oracle (0.8-0.10): "Compute Capability < 8.0 is not
# supported by the V1 Engine. Falling back to V0."; the V0 engine was removed in 0.11.
V0_FALLBACK_UNTIL = (0, 11, 0)
PRE_AMPERE_GPUS = ("T4", "V100-32GB", "RTX-2080Ti-22GB")
# Engines other than vLLM: the planner's fixed defaults (their own flags: SGLang --max-running-requests,
# TGI --max-concurrent-requests, ...).
OTHER_MAX_NUM_SEQS, OTHER_BATCHED_TOKENS = 256, 8192


@dataclass(slots=True, frozen=True)
class SchedulerLimits:
    """What the engine schedules per step, and how vLLM of that version accounts memory."""

    version: tuple[int, int, int]
    is_v1: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    family: VllmFamily = FAMILIES[-1]
    flashinfer_sampler: bool | None = None  # the request's setting; None = the family's default
    model_runner_v2: bool = False  # vLLM serves this model through Model Runner V2 (vllm_versions)

    @property
    def uses_flashinfer_sampler(self) -> bool:
        """FlashInfer's top-k/top-p path in the profile (Model Runner V2's dummy batch uses none)."""
        return not self.model_runner_v2 and vllm_versions.uses_flashinfer_sampler(
            self.family, self.flashinfer_sampler
        )

    @property
    def sampler_state_bytes_per_logit(self) -> float:
        """Bytes per max_num_seqs x vocabulary logit the sampler keeps (MRV2's penalty bins)."""
        return vllm_versions.MRV2_SAMPLER_STATE_BYTES_PER_LOGIT if self.model_runner_v2 else 0.0

    @property
    def sampler_shards(self) -> bool:
        """Each TP rank samples 1/TP of the dummy batch (MRV2 batch-sharded sampling)."""
        return self.model_runner_v2 and self.family.sharded_sampling

    @property
    def subtracts_cuda_graphs(self) -> bool:
        """The CUDA-graph estimate comes out of the KV budget (vLLM >= 0.21 on Model Runner V1; V2's
        profile_cudagraph_memory() returns 0)."""
        return self.family.subtracts_cuda_graphs and not self.model_runner_v2

    @property
    def sampler_bytes_per_logit(self) -> float:
        """Live bytes per logit of the profile's dummy sampler run (FlashInfer's path, vLLM's own, or
        Model Runner V2's top-k/top-p-free dummy batch)."""
        if self.model_runner_v2:
            return vllm_versions.MRV2_SAMPLER_BYTES_PER_LOGIT
        return vllm_versions.sampler_bytes_per_logit(self.family, self.flashinfer_sampler)


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.10.1.1' -> (0, 10, 1); ValueError for anything that is not a vLLM release number."""
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", str(text).strip())
    if not match:
        raise UserError(f"vllm_version must look like 0.11.2, got {text!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def _is_large_gpu(gpu: GPU) -> bool:
    return gpu.usable_bytes >= LARGE_GPU_BYTES and "a100" not in gpu.name.lower()


def _v1_defaults(family: VllmFamily, context: str, gpu: GPU) -> tuple[int, int]:
    if family.large_gpu_defaults and _is_large_gpu(gpu):
        return V1_MAX_NUM_SEQS_LARGE, V1_BATCHED_TOKENS_LARGE[context]
    return V1_MAX_NUM_SEQS, V1_BATCHED_TOKENS[context]


def scheduler_limits(
    engine: str, version_text: str | None, context: str, gpu: GPU, max_model_len: int
) -> SchedulerLimits:
    """vLLM's own defaults for this version, usage context and GPU; the embedded engine's are EngineConfig's;
    other engines get fixed ones."""
    version = parse_version(version_text or VLLM_TARGET_VERSION)
    family = family_for(version)
    if engine == "embedded":
        from backend.engine.config import config_field

        seqs, tokens = config_field("max_num_seqs").default, config_field("max_num_batched_tokens").default
        return SchedulerLimits(version, True, seqs, tokens, True, family)  # type: ignore[arg-type]
    if engine != "vllm":
        return SchedulerLimits(version, True, OTHER_MAX_NUM_SEQS, OTHER_BATCHED_TOKENS, True, family)
    if not family.is_v1 or (version < V0_FALLBACK_UNTIL and gpu.name in PRE_AMPERE_GPUS):
        v0 = replace(family_for((0, 7, 0)), name=f"{family.name}, V0 fallback") if family.is_v1 else family
        chunked = max_model_len > V0_LONG_CONTEXT
        tokens = V0_CHUNKED_BATCHED_TOKENS if chunked else max(max_model_len, V0_CHUNKED_BATCHED_TOKENS)
        return SchedulerLimits(version, False, V0_MAX_NUM_SEQS, tokens, chunked, v0)
    seqs, tokens = _v1_defaults(family, context, gpu)
    return SchedulerLimits(version, True, seqs, tokens, True, family)


def resolve_limits(req: PlanRequest, gpu: GPU, max_model_len: int, moe: bool = False) -> SchedulerLimits:
    """The request's own max_num_seqs / max_num_batched_tokens where set, the engine's defaults elsewhere;
    moe: the model is a mixture of experts (Model Runner V2 reaches those later)."""
    limits = scheduler_limits(req.engine, req.vllm_version, req.usage_context, gpu, max_model_len)
    seqs = req.max_num_seqs or limits.max_num_seqs
    tokens = req.max_num_batched_tokens or limits.max_num_batched_tokens
    chunked = limits.chunked_prefill
    if not limits.is_v1 and req.max_num_batched_tokens and req.max_num_batched_tokens < max_model_len:
        chunked = True  # V0 only accepts a budget below max_model_len with chunked prefill
    return replace(
        limits,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        chunked_prefill=chunked,
        flashinfer_sampler=req.flashinfer_sampler,
        model_runner_v2=(
            req.engine == "vllm" and limits.is_v1 and vllm_versions.uses_model_runner_v2(limits.family, moe)
        ),
    )


def custom_all_reduce(gpu: GPU, disable_custom_all_reduce: bool) -> bool:
    """vLLM's custom all-reduce (and NVLS / symmetric memory) runs only over NVLink: without peer-to-peer
    access, across nodes or with --disable-custom-all-reduce it logs "Custom allreduce is disabled" and
    NCCL's rings carry the all-reduce (vllm/distributed/device_communicators/custom_all_reduce.py)."""
    return "NVLink" in gpu.interconnect and not disable_custom_all_reduce


def non_torch_bytes(
    family: VllmFamily, gpu: GPU, tp: int, pp: int, disable_custom_all_reduce: bool = False
) -> int:
    """vLLM's non-torch memory per GPU for this family and layout (vllm_versions.NonTorch)."""
    nvlink = custom_all_reduce(gpu, disable_custom_all_reduce)
    return vllm_versions.non_torch_bytes(family, tp, pp, nvlink)


def with_scheduler_defaults(req: PlanRequest, max_model_len: int | None = None) -> PlanRequest:
    """req with max_num_seqs / max_num_batched_tokens filled in as its engine would pick them (exporters
    write explicit flags; the planner reads None as the engine's default)."""
    if req.max_num_seqs and req.max_num_batched_tokens:
        return req
    try:
        gpu = get_gpu(req.gpu)
    except ValueError:  # a GPU outside the catalog: the generic defaults
        gpu = None
    if gpu is None:
        seqs, tokens = OTHER_MAX_NUM_SEQS, OTHER_BATCHED_TOKENS
    else:
        limits = resolve_limits(req, gpu, max_model_len or req.max_model_len or V0_LONG_CONTEXT)
        seqs, tokens = limits.max_num_seqs, limits.max_num_batched_tokens
    return replace(
        req,
        max_num_seqs=req.max_num_seqs or seqs,
        max_num_batched_tokens=req.max_num_batched_tokens or tokens,
    )
