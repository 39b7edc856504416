"""A CPU host as the planner's speed model sees it: cores the engine computes on, the instruction set that
picks its kernels, and the host's memory bandwidth when known. The catalog's CPU entry (presets/gpus.yaml)
describes one; local_cpu_host() describes this machine, for plans of the engine that runs here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Literal

from backend.cpu_features import cpu_features
from backend.engine.cpu_quota import quota_cpus, threads_within_quota

CPUIsa = Literal["amx", "avx512_bf16", "avx512", "avx2", "baseline"]
CPU_ISAS: tuple[CPUIsa, ...] = ("amx", "avx512_bf16", "avx512", "avx2", "baseline")
# /proc/cpuinfo flags that name each ISA, most capable first (backend/engine/cpu_kernels.py builds for them)
ISA_FLAGS: tuple[tuple[CPUIsa, str], ...] = (
    ("amx", "amx_bf16"),
    ("avx512_bf16", "avx512_bf16"),
    ("avx512", "avx512f"),
    ("avx2", "avx2"),
)


@dataclass(slots=True, frozen=True)
class CPUHost:
    cores: int  # threads the engine computes on (torch's intra-op threads: one a physical core)
    isa: CPUIsa
    memory_bandwidth_bytes_s: float | None = None  # the host's DRAM peak; None: not known (this machine)

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"a CPU host needs at least 1 core, got {self.cores}")
        if self.isa not in CPU_ISAS:
            raise ValueError(f"unknown CPU ISA {self.isa!r}; choose one of: {', '.join(CPU_ISAS)}")

    @property
    def has_fast_bf16(self) -> bool:
        """bf16 products in hardware: the engine's dtype "auto" is bf16 here, else fp32 (engine/device.py)."""
        return self.isa in ("amx", "avx512_bf16")


def isa_from_flags(flags: set[str]) -> CPUIsa:
    return next((isa for isa, flag in ISA_FLAGS if flag in flags), "baseline")


def _engine_threads() -> int:
    """Threads torch computes on: OMP_NUM_THREADS when set, else one a physical core this process may use,
    within a container's CPU quota (the engine's limit_torch_threads)."""
    import psutil

    wanted = os.environ.get("OMP_NUM_THREADS", "")
    if wanted.isdigit() and int(wanted) > 0:
        return int(wanted)
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    logical, physical = psutil.cpu_count() or allowed, psutil.cpu_count(logical=False) or allowed
    return threads_within_quota(max(1, min(allowed, allowed * physical // logical)), quota_cpus())


@cache
def local_cpu_host() -> CPUHost:
    """This machine: the engine's threads and the ISA its kernels are built for (bandwidth not measured)."""
    return CPUHost(_engine_threads(), isa_from_flags(set(cpu_features().flags)))
