"""vLLM's version families: what each range of releases does that moves the KV-cache figure.

A family starts at a release and holds until the next one; `family_for(version)` picks it. Every field
names the vLLM source it follows or the published logs it was read from (tests/data/vllm_logs.yaml, fit
split only). vllm_rules.py turns a family, a GPU and a request into scheduler limits and memory terms.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.planner.catalog import GIB

# Live bytes per logit of the profile's dummy sampler run (top_k = vocab - 1, top_p < 1:
# vllm/v1/worker/gpu_model_runner.py _dummy_sampler_run; V0: worker/model_runner.py profile_run).
# PyTorch's sort path (vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p): bf16 logits 2 + fp32
# copy 4 + sorted values 4 + int64 indices 8 + the sort's scratch 12 + softmax 4 + scatter 4 = 38; logged
# 37-39 where the sampler dominates (256 x 151,936 logits: 1.40 GiB, Qwen2.5-Math-1.5B; 256 x 128,256:
# 1.26 GiB, vllm#10511; 1024 x 151,936: 5.56 GiB, llm-d 0.11 Qwen3-0.6B).
SORT_SAMPLER_BYTES_PER_LOGIT = 38.0
# From 0.17 the Triton top-k/top-p kernels (vllm#33538) mask in place: vLLM 0.19 logs 15.2-15.9 bytes per
# logit where the sampler dominates (llm-d-planner v0.19.0: Llama-3.1-8B 1.89 GiB, Qwen2.5-7B 2.21 GiB,
# phi-4 1.52 GiB for 1024 sequences), and the 0.15 -> 0.17 sweep of Qwen3-14B falls 5.64 -> 2.23 GiB.
TRITON_SAMPLER_BYTES_PER_LOGIT = 15.5
# FlashInfer's path (topk_topp_sampler.py forward_cuda -> flashinfer_sample ->
# flashinfer.sampling.top_k_top_p_sampling_from_logits): the caller's bf16 logits 2 + the sampler's fp32
# copy 4 + top_k_mask_logits' masked copy 4 + softmax probabilities 4 = 14; no sort, no int64 indices.
# "Using FlashInfer for top-p & top-k sampling." in the log says this path ran.
FLASHINFER_SAMPLER_BYTES_PER_LOGIT = 14.0
# Model Runner V2 (vllm/v1/worker/gpu/model_runner.py, the default for dense models from 0.25 and for all
# from 0.29): _dummy_sampler_run samples a dummy batch whose requests have no top-k / top-p ("the sampler
# may skip top_k, top_p, and logprobs"), so the profile holds the bf16 logits 2 + the sampler's fp32 copy
# 4 (gpu/sample/sampler.py) = 6 bytes a logit; and its PenaltiesState keeps max_num_seqs x vocabulary
# int32 output_bin_counts plus a bit mask (gpu/sample/penalties.py: "can be very large, taking up GBs")
# for as long as the engine runs, 4 + 1/8 bytes a logit.
MRV2_SAMPLER_BYTES_PER_LOGIT = 6.0
MRV2_SAMPLER_STATE_BYTES_PER_LOGIT = 4.125


@dataclass(slots=True, frozen=True)
class NonTorch:
    """vLLM's non-torch memory per GPU (NCCL and custom all-reduce / symmetric-memory buffers, cuBLAS
    workspaces that torch does not allocate; the CUDA context is outside it), in GiB."""

    tp1: float  # one GPU
    pp_only: float  # pipeline parallel without TP
    tp_nvlink: float  # TP > 1 on NVLink GPUs (custom all-reduce, NVLS / symmetric memory)
    tp_pcie: float  # TP > 1 over PCIe (NCCL rings only; custom all-reduce off without P2P)


@dataclass(slots=True, frozen=True)
class VllmFamily:
    """One range of vLLM releases and the accounting it does at startup."""

    name: str
    since: tuple[int, int, int]
    is_v1: bool  # the V1 engine by default (V0 before 0.8; pre-Ampere GPUs stay on V0 until 0.11)
    large_gpu_defaults: bool  # EngineArgs.get_batch_defaults: 1024 sequences on >= 70 GiB, not A100
    native_sampler_bytes: float  # per logit, vLLM's own top-k/top-p path (PyTorch sort, later Triton)
    flashinfer_sampler_default: bool  # FlashInfer's sampler runs unless told not to (installed by default)
    non_torch: NonTorch
    subtracts_cuda_graphs: bool  # the CUDA-graph estimate comes out of the KV budget (Model Runner V1)
    source: str
    mrv2_dense: bool = False  # Model Runner V2 serves dense models (vllm#44443)
    mrv2_moe: bool = False  # ... and MoE models
    sharded_sampling: bool = False  # each TP rank samples 1/TP of the rows (MRV2 batch-sharded sampling)


# V0 (0.6-0.7): vllm/worker/worker.py determine_num_available_blocks; non-torch 0.01-0.10 GiB at TP=1
# (T4, A10, L40S, V100, RTX 3090 logs), 0.25 GiB at TP=2 over PCIe (vllm#13061, 2 x RTX 4090) and 3.58 GiB
# at TP=2 on H100 NVLink (vllm#10511, NCCL's NVLS buffers and the custom all-reduce).
_V0 = VllmFamily(
    "0.6-0.7 (V0 engine)",
    (0, 6, 0),
    False,
    False,
    SORT_SAMPLER_BYTES_PER_LOGIT,
    False,
    NonTorch(0.08, 0.08, 3.58, 0.25),
    False,
    "vllm/worker/worker.py determine_num_available_blocks; vllm#10511, vllm#13061",
)
# The version backend/export/vllm.py writes launch files for (tests/planner/test_planner_vllm.py checks
# they agree).
VLLM_TARGET_VERSION = "0.33.0"

FAMILIES: tuple[VllmFamily, ...] = (
    _V0,
    # 0.8: V1 by default (VLLM_USE_V1), vllm/v1/worker/gpu_worker.py determine_available_memory; V1's
    # scheduler defaults 256 sequences, 2048 (serve) / 8192 (LLM) tokens, chunked prefill always on.
    VllmFamily(
        "0.8 (V1 engine)",
        (0, 8, 0),
        True,
        False,
        SORT_SAMPLER_BYTES_PER_LOGIT,
        False,
        NonTorch(0.08, 0.08, 0.54, 0.25),
        False,
        "vllm/v1/worker/gpu_worker.py; vllm/engine/arg_utils.py (V1 defaults)",
    ),
    # 0.9: get_batch_defaults gives GPUs of >= 70 GiB that are not A100s 1024 sequences and 8192 / 16384
    # tokens (vllm#17885 keeps A100 out). FlashInfer's sampler runs from 0.9 (vllm#15777 adapted it to
    # FlashInfer >= 0.2.3; 0.8 turned it off for those, vllm#14815) to 0.11.0 wherever FlashInfer is
    # installed (the Docker images; "Using FlashInfer for top-p & top-k sampling."), and a pip install
    # of these releases has none ("FlashInfer is not available. Falling back to the PyTorch-native
    # implementation"): unset, the planner assumes the pip install, as the gpt-oss logs of 0.10.1 and
    # 0.11.0 show (vllm#23278, vllm#27508). 0.11.1 switched it off by default (vllm#26859).
    VllmFamily(
        "0.9-0.10",
        (0, 9, 0),
        True,
        True,
        SORT_SAMPLER_BYTES_PER_LOGIT,
        False,
        NonTorch(0.08, 0.08, 0.54, 0.25),
        False,
        "vllm/engine/arg_utils.py get_batch_defaults (vllm#17885)",
    ),
    # 0.11: the V0 engine removed; non-torch memory 0.13-0.14 GiB at TP=1 and 0.54-0.55 GiB at TP=2 on
    # H100s (llm-d capacity planner, vLLM 0.11.0; 0.13 GiB in 0.15 and 0.16, llm-d-planner's sweep).
    VllmFamily(
        "0.11-0.16",
        (0, 11, 0),
        True,
        True,
        SORT_SAMPLER_BYTES_PER_LOGIT,
        False,
        NonTorch(0.13, 0.13, 0.54, 0.25),
        False,
        "llm-d empirical-vllm-memory-results.md (0.11.0); llm-d-planner version sweep (0.15, 0.16)",
    ),
    VllmFamily(
        "0.17",
        (0, 17, 0),
        True,
        True,
        TRITON_SAMPLER_BYTES_PER_LOGIT,
        False,
        NonTorch(0.13, 0.13, 0.54, 0.25),
        False,
        "vllm#33538 (Triton top-k/top-p); llm-d-planner version sweep (0.17)",
    ),
    # 0.18: non-torch 0.25 GiB at TP=1, 0.07 GiB with PP alone, 2.06-2.21 GiB at TP=2-4 on H100 NVLink
    # (symmetric-memory all-reduce; llm-d-planner v0.19.0 logs).
    VllmFamily(
        "0.18-0.20",
        (0, 18, 0),
        True,
        True,
        TRITON_SAMPLER_BYTES_PER_LOGIT,
        False,
        NonTorch(0.25, 0.07, 2.1, 0.25),
        False,
        "llm-d-planner version sweep (0.18) and v0.19.0 logs",
    ),
    # 0.21: the CUDA-graph pool is estimated before the KV cache is sized and subtracted from the budget
    # ("CUDA graph memory profiling is enabled (default since v0.21.0)";
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS).
    VllmFamily(
        "0.21",
        (0, 21, 0),
        True,
        True,
        TRITON_SAMPLER_BYTES_PER_LOGIT,
        False,
        NonTorch(0.25, 0.07, 2.1, 0.25),
        True,
        "vllm/v1/worker/gpu_worker.py determine_available_memory (0.21)",
    ),
    # 0.22: FlashInfer's top-k/top-p sampler is on by default again (vllm#40376, opened 2026-04-20 after
    # 0.19.0; flashinfer-python is a dependency of the CUDA wheels since vllm#26859's time): a vLLM 0.22.0
    # log prints "Using FlashInfer for top-p & top-k sampling." with no opt-in. No 0.20 / 0.21 log with
    # that line was found, so 0.20 and 0.21 keep the Triton path of 0.17-0.19.
    VllmFamily(
        "0.22-0.24",
        (0, 22, 0),
        True,
        True,
        TRITON_SAMPLER_BYTES_PER_LOGIT,
        True,
        NonTorch(0.25, 0.07, 2.1, 0.25),
        True,
        "vllm#40376 (FlashInfer sampler on by default); vLLM 0.22.0 startup log",
    ),
    # 0.25: Model Runner V2 becomes the default for dense models (vllm#44443 merged 2026-07-02; 0.25.1 adds
    # "or not model_config.is_moe" to VllmConfig._is_default_v2_model_runner_model; a 0.27.1 log loads
    # through model_runner.py). Its profile (MRV2_SAMPLER_* above) and its profile_cudagraph_memory(),
    # which returns 0, so no CUDA-graph estimate comes out of the budget; MoE models stay on V1.
    VllmFamily(
        "0.25-0.28",
        (0, 25, 0),
        True,
        True,
        TRITON_SAMPLER_BYTES_PER_LOGIT,
        True,
        NonTorch(0.25, 0.07, 2.1, 0.25),
        True,
        "vllm#44443; vllm/v1/worker/gpu/model_runner.py, sample/sampler.py, sample/penalties.py",
        mrv2_dense=True,
    ),
    # 0.29: "MRV2 is now the default runner for all models", with batch-sharded sampling that "reduces
    # per-step logits memory by 1/TP" (v0.29.0 release notes; vllm/v1/worker/gpu/sample/batch_shard.py).
    VllmFamily(
        "0.29+",
        (0, 29, 0),
        True,
        True,
        TRITON_SAMPLER_BYTES_PER_LOGIT,
        True,
        NonTorch(0.25, 0.07, 2.1, 0.25),
        True,
        "vLLM 0.29.0 release notes (MRV2 for all models, batch-sharded sampling)",
        mrv2_dense=True,
        mrv2_moe=True,
        sharded_sampling=True,
    ),
)


def family_for(version: tuple[int, int, int]) -> VllmFamily:
    """The family a release belongs to; releases before 0.6 are planned as 0.6 (the oldest modelled)."""
    found = _V0
    for family in FAMILIES:
        if version >= family.since:
            found = family
    return found


def uses_model_runner_v2(family: VllmFamily, moe: bool) -> bool:
    """Whether this release serves the model through Model Runner V2."""
    return family.mrv2_moe if moe else family.mrv2_dense


def uses_flashinfer_sampler(family: VllmFamily, flashinfer_sampler: bool | None) -> bool:
    """Whether the profile's dummy sampler takes FlashInfer's path: the request's setting (what the log's
    topk_topp_sampler line says, or VLLM_USE_FLASHINFER_SAMPLER), else the family's default."""
    return family.flashinfer_sampler_default if flashinfer_sampler is None else flashinfer_sampler


def sampler_bytes_per_logit(family: VllmFamily, flashinfer_sampler: bool | None) -> float:
    """Live bytes per logit of the profile's dummy sampler run for this family and sampler path."""
    if uses_flashinfer_sampler(family, flashinfer_sampler):
        return FLASHINFER_SAMPLER_BYTES_PER_LOGIT
    return family.native_sampler_bytes


def non_torch_gib(family: VllmFamily, tp: int, pp: int, nvlink: bool) -> float:
    nt = family.non_torch
    if tp > 1:
        return nt.tp_nvlink if nvlink else nt.tp_pcie
    return nt.pp_only if pp > 1 else nt.tp1


def non_torch_bytes(family: VllmFamily, tp: int, pp: int, nvlink: bool) -> int:
    return int(non_torch_gib(family, tp, pp, nvlink) * GIB)


def version_choices(target: str) -> list[str]:
    """The versions a form offers: the export's target, then each family's first release, newest first."""
    firsts = [".".join(map(str, f.since)) for f in reversed(FAMILIES)]
    return list(dict.fromkeys([target, *firsts]))
