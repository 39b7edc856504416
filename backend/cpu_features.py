"""What this machine's CPU offers, read once: the instruction-set flags that pick the engine's kernels and
its default dtype, the model name reports print, and the cores. Every reader of the CPU's features asks
cpu_features(); nothing else opens /proc/cpuinfo.

Off Linux (no /proc/cpuinfo) the flags are empty, so every feature reads as absent and the engine takes its
portable paths; the model name falls back to the platform's.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import psutil

CPUINFO = Path("/proc/cpuinfo")
# x86 flags as Linux names them (arch/x86/include/asm/cpufeatures.h); the ones the engine chooses by
AVX512_CORE = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd")  # what -march=skylake-avx512 uses


@dataclass(slots=True, frozen=True)
class CPUFeatures:
    model_name: str
    flags: tuple[str, ...]  # /proc/cpuinfo's "flags" line, in its order
    logical_cores: int
    physical_cores: int

    def has(self, *names: str) -> bool:
        """Whether the CPU has every one of these flags (Linux's names, e.g. "avx512_bf16")."""
        return all(name in self.flags for name in names)

    @property
    def has_avx2(self) -> bool:
        return self.has("avx2")

    @property
    def has_avx512(self) -> bool:
        return self.has(*AVX512_CORE)

    @property
    def has_avx512_bf16(self) -> bool:
        return self.has("avx512_bf16")

    @property
    def has_amx_bf16(self) -> bool:
        return self.has("amx_bf16")

    @property
    def has_fast_bf16(self) -> bool:
        """bf16 products in hardware (AVX-512 bf16 or AMX)."""
        return self.has_avx512_bf16 or self.has_amx_bf16


def parse_cpuinfo(text: str, logical_cores: int = 1, physical_cores: int = 1) -> CPUFeatures:
    """The features /proc/cpuinfo's text describes (its first processor; all cores are alike)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown"
    return CPUFeatures(name, tuple(fields.get("flags", "").split()), logical_cores, physical_cores)


@cache
def cpu_features() -> CPUFeatures:
    """This machine's CPU (read once per process)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        text = ""
    logical = os.cpu_count() or 1
    return parse_cpuinfo(text, logical, psutil.cpu_count(logical=False) or logical)
