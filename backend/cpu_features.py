"""What this machine's CPU offers, read once: the instruction-set flags that pick the engine's kernels and
its default dtype, the model name reports print, and the cores. Every reader of the CPU's features asks
cpu_features(); nothing else opens /proc/cpuinfo.

Off Linux (no /proc/cpuinfo) the flags are empty, so every feature reads as absent and the engine takes its
portable paths; the model name falls back to the platform's.

PLAYGROUND_CPU_ISA=avx2 makes a CPU with AVX-512 or AMX act as one with AVX2 only (its avx512* and amx*
flags hidden; the kernels built for -march=haswell, llama.cpp's AVX2 build beside them): the AVX2 paths
tested and benched on any x86 machine, as the CPUs this project meets differ from one machine to the next.
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
ISA_VARIABLE = "PLAYGROUND_CPU_ISA"
ISA_HIDDEN = {"avx2": ("avx512", "amx", "avx_vnni")}  # the flags' prefixes each ISA setting hides


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


def cpu_isa() -> str:
    """PLAYGROUND_CPU_ISA: "" (the CPU as it is) or the instruction set it acts as ("avx2")."""
    value = os.environ.get(ISA_VARIABLE, "").strip().lower()
    if value and value not in ISA_HIDDEN:
        raise ValueError(f"{ISA_VARIABLE}={value!r}: allowed values are {', '.join(ISA_HIDDEN)} (or unset)")
    return value


def hide_flags(features: CPUFeatures, isa: str) -> CPUFeatures:
    """features as a CPU acting as isa (a key of ISA_HIDDEN, or "": unchanged) reports them."""
    if not isa:
        return features
    flags = tuple(f for f in features.flags if not f.startswith(ISA_HIDDEN[isa]))
    return CPUFeatures(features.model_name, flags, features.logical_cores, features.physical_cores)


@cache
def cpu_features() -> CPUFeatures:
    """This machine's CPU (read once per process), as PLAYGROUND_CPU_ISA makes it act."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        text = ""
    logical = os.cpu_count() or 1
    features = parse_cpuinfo(text, logical, psutil.cpu_count(logical=False) or logical)
    return hide_flags(features, cpu_isa())
