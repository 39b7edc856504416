"""The rules by which vLLM sizes its KV cache, per vLLM version: scheduler defaults and what it subtracts.

The planner models the vLLM version the export targets (VLLM_TARGET_VERSION); a PlanRequest may name
another (vllm_version). Every rule below names the vLLM source it follows; tests/data/vllm_logs.yaml
holds the published startup logs it is checked against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from backend.errors import UserError
from backend.planner import memory
from backend.planner.catalog import GIB, GPU, get_gpu
from backend.planner.request import PlanRequest

# The version backend/export/vllm.py writes launch files for (tests/test_planner_vllm.py checks they agree).
VLLM_TARGET_VERSION = "0.33.0"
# V1 became the default engine in 0.8.0 (VLLM_USE_V1=1); the V0 engine was removed in 0.11.
V1_SINCE = (0, 8, 0)
# vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (from 0.9; PR #17885 keeps A100 out): on a GPU
# with >= 70 GiB that is not an A100, 16384 (LLM class) / 8192 (API server) batched tokens and 1024
# sequences; otherwise 8192 / 2048 tokens and 256 sequences. Before 0.9, V1 used 8192 / 2048 and 256.
LARGE_DEFAULTS_SINCE = (0, 9, 0)
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
# vllm/v1/worker/gpu_worker.py determine_available_memory: from 0.21 the CUDA-graph pool is estimated
# before the KV cache is sized and subtracted from the budget (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS,
# "CUDA graph memory profiling is enabled (default since v0.21.0)" in the startup log).
CUDA_GRAPH_ESTIMATE_SINCE = (0, 21, 0)
# vllm/engine/arg_utils.py _is_v1_supported_oracle (0.8-0.10): "Compute Capability < 8.0 is not
# supported by the V1 Engine. Falling back to V0."; the V0 engine was removed in 0.11.
V0_FALLBACK_UNTIL = (0, 11, 0)
PRE_AMPERE_GPUS = ("T4", "V100-32GB")
# vllm/v1/sample/ops/topk_topp_sampler.py: up to 0.16 the profile's dummy sampler run (top_k = vocab - 1,
# top_p < 1) takes PyTorch's sort path, ~38 live bytes per logit (memory.SAMPLER_BYTES_PER_LOGIT). From 0.17
# the Triton top-k/top-p kernels (vllm#33538) mask the logits in place: the logged peak fell 60% from 0.16
# to 0.17 (Qwen3-14B on an H100, 1024 sequences: 5.64 -> 2.23 GiB, llm-d-planner's version sweep) and
# vLLM 0.19 logs 15.2-15.9 bytes per logit where the sampler dominates (Llama-3.1-8B 1.89 GiB, Qwen2.5-7B
# 2.21 GiB, phi-4 1.52 GiB, gemma-2-9b 3.65 GiB: llm-d-planner accuracy/results/v0.19.0/results_raw.csv).
TRITON_SAMPLER_SINCE = (0, 17, 0)
TRITON_SAMPLER_BYTES_PER_LOGIT = 15.5
# Non-torch memory ("non-torch forward increase memory") from 0.18, same sources: 0.25 GiB at TP=1 (0.13
# up to 0.17), 0.07 GiB with pipeline parallelism alone, and at TP>1 on NVLink GPUs about 2.1 GiB per GPU
# (H100, vLLM 0.19: 2.06-2.11 GiB at TP=2, 2.13-2.21 GiB at TP=4; 0.54 GiB at TP=2 in 0.11). PCIe GPUs at
# TP>1 keep the earlier figure (no log of vLLM >= 0.18 with TP>1 on PCIe collected).
NON_TORCH_RAISED_SINCE = (0, 18, 0)
NON_TORCH_TP1_BYTES = int(0.25 * GIB)
NON_TORCH_PP_ONLY_BYTES = int(0.07 * GIB)
NON_TORCH_TP_NVLINK_BYTES = int(2.1 * GIB)
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
    subtracts_cuda_graphs: bool  # the CUDA-graph estimate comes out of the KV budget
    sampler_bytes_per_logit: float = memory.SAMPLER_BYTES_PER_LOGIT  # the profile's dummy sampler run


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.10.1.1' -> (0, 10, 1); ValueError for anything that is not a vLLM release number."""
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", str(text).strip())
    if not match:
        raise UserError(f"vllm_version must look like 0.11.2, got {text!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def _is_large_gpu(gpu: GPU) -> bool:
    return gpu.usable_bytes >= LARGE_GPU_BYTES and "a100" not in gpu.name.lower()


def _v1_defaults(version: tuple[int, int, int], context: str, gpu: GPU) -> tuple[int, int]:
    if version >= LARGE_DEFAULTS_SINCE and _is_large_gpu(gpu):
        return V1_MAX_NUM_SEQS_LARGE, V1_BATCHED_TOKENS_LARGE[context]
    return V1_MAX_NUM_SEQS, V1_BATCHED_TOKENS[context]


def scheduler_limits(
    engine: str, version_text: str | None, context: str, gpu: GPU, max_model_len: int
) -> SchedulerLimits:
    """vLLM's own defaults for this version, usage context and GPU; the embedded engine's are EngineConfig's;
    other engines get fixed ones."""
    version = parse_version(version_text or VLLM_TARGET_VERSION)
    if engine == "embedded":
        from backend.engine.config import config_field

        seqs, tokens = config_field("max_num_seqs").default, config_field("max_num_batched_tokens").default
        return SchedulerLimits(version, True, seqs, tokens, True, False)  # type: ignore[arg-type]
    if engine != "vllm":
        return SchedulerLimits(version, True, OTHER_MAX_NUM_SEQS, OTHER_BATCHED_TOKENS, True, False)
    if version < V1_SINCE or (version < V0_FALLBACK_UNTIL and gpu.name in PRE_AMPERE_GPUS):
        chunked = max_model_len > V0_LONG_CONTEXT
        tokens = V0_CHUNKED_BATCHED_TOKENS if chunked else max(max_model_len, V0_CHUNKED_BATCHED_TOKENS)
        return SchedulerLimits(version, False, V0_MAX_NUM_SEQS, tokens, chunked, False)
    seqs, tokens = _v1_defaults(version, context, gpu)
    sampler = (
        TRITON_SAMPLER_BYTES_PER_LOGIT if version >= TRITON_SAMPLER_SINCE else memory.SAMPLER_BYTES_PER_LOGIT
    )
    return SchedulerLimits(version, True, seqs, tokens, True, version >= CUDA_GRAPH_ESTIMATE_SINCE, sampler)


def resolve_limits(req: PlanRequest, gpu: GPU, max_model_len: int) -> SchedulerLimits:
    """The request's own max_num_seqs / max_num_batched_tokens where set, the engine's defaults elsewhere."""
    limits = scheduler_limits(req.engine, req.vllm_version, req.usage_context, gpu, max_model_len)
    seqs = req.max_num_seqs or limits.max_num_seqs
    tokens = req.max_num_batched_tokens or limits.max_num_batched_tokens
    chunked = limits.chunked_prefill
    if not limits.is_v1 and req.max_num_batched_tokens and req.max_num_batched_tokens < max_model_len:
        chunked = True  # V0 only accepts a budget below max_model_len with chunked prefill
    return replace(limits, max_num_seqs=seqs, max_num_batched_tokens=tokens, chunked_prefill=chunked)


def non_torch_bytes(version: tuple[int, int, int], gpu: GPU, tp: int, pp: int) -> int:
    """vLLM's non-torch memory per GPU for this version and layout (the constants above)."""
    if version < NON_TORCH_RAISED_SINCE:
        return memory.non_torch_bytes(tp * pp)
    if tp > 1:
        return NON_TORCH_TP_NVLINK_BYTES if "NVLink" in gpu.interconnect else memory.NON_TORCH_MULTI_GPU_BYTES
    return NON_TORCH_PP_ONLY_BYTES if pp > 1 else NON_TORCH_TP1_BYTES


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
