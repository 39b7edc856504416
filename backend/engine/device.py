"""Device, dtype and memory facts: where to run, in which precision, how much room the KV pool may take."""

from __future__ import annotations

from functools import cache

import torch

from backend.cpu_features import cpu_features, cpu_isa

CPU_KV_CACHE_CAP_BYTES = 2 * 1024**3  # a shared CPU box: never take more by default
CPU_KV_CACHE_SHARE = 0.2  # of available memory
GPU_KV_CACHE_SHARE = 0.85  # of free device memory after the weights are loaded


@cache
def cpu_has_fast_bf16() -> bool:
    """True when the CPU has AMX or AVX-512 bf16 (bf16 matmuls are then much faster than fp32); a CPU acting
    as another (PLAYGROUND_CPU_ISA) answers from its flags alone."""
    if cpu_features().has_fast_bf16:
        return True
    return not cpu_isa() and torch.backends.cpu.get_cpu_capability() in ("AVX512_BF16", "AMX")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            "device='cuda' was requested but no CUDA GPU is available; use device='cpu' or 'auto'"
        )
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


def kv_cache_budget_bytes(device: torch.device) -> int:
    """Default memory for the KV pool when neither num_kv_blocks nor kv_cache_memory_bytes is given."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * GPU_KV_CACHE_SHARE)
    import psutil

    return int(min(psutil.virtual_memory().available * CPU_KV_CACHE_SHARE, CPU_KV_CACHE_CAP_BYTES))
