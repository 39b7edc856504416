"""The one reader of the CPU's features: /proc/cpuinfo's text to flags, model name and cores."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from backend.cpu_features import CPUINFO, ISA_VARIABLE, cpu_features, cpu_isa, hide_flags, parse_cpuinfo
from backend.planner.cpu_host import isa_from_flags

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni

processor\t: 1
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni
"""


def test_flags_name_and_features_from_cpuinfo():
    cpu = parse_cpuinfo(EPYC, logical_cores=2, physical_cores=1)
    assert cpu.model_name == "AMD EPYC 9B14"
    assert cpu.flags[:3] == ("fpu", "sse2", "avx2")  # the first processor's line, in its order
    assert cpu.has_avx2 and cpu.has_avx512 and cpu.has_avx512_bf16 and cpu.has_fast_bf16
    assert not cpu.has_amx_bf16 and not cpu.has("amx_tile")
    assert cpu.has("avx512_vnni", "fma") and not cpu.has("avx512_vnni", "amx_bf16")
    assert (cpu.logical_cores, cpu.physical_cores) == (2, 1)
    assert isa_from_flags(set(cpu.flags)) == "avx512_bf16"


def test_without_cpuinfo_every_feature_is_absent():
    cpu = parse_cpuinfo("")
    assert cpu.flags == () and not (cpu.has_avx2 or cpu.has_avx512 or cpu.has_fast_bf16)
    assert cpu.model_name == (platform.processor() or platform.machine() or "unknown")


def test_this_machine_is_read_once():
    assert cpu_features() is cpu_features()
    if CPUINFO.exists():
        assert set(cpu_features().flags) == set(parse_cpuinfo(Path(CPUINFO).read_text()).flags)
    assert cpu_features().logical_cores >= cpu_features().physical_cores >= 1


def test_a_cpu_acting_as_avx2_hides_avx512_and_amx(monkeypatch):
    """PLAYGROUND_CPU_ISA=avx2: the engine, the planner and the kernels' -march see an AVX2 CPU."""
    from backend.engine import cpu_kernels

    cpu = hide_flags(parse_cpuinfo(EPYC.replace("avx512_vnni", "avx512_vnni amx_bf16 avx_vnni", 1)), "avx2")
    assert cpu.flags == ("fpu", "sse2", "avx2", "fma")
    assert cpu.has_avx2 and not cpu.has_avx512 and not cpu.has_fast_bf16
    assert isa_from_flags(set(cpu.flags)) == "avx2"
    assert hide_flags(parse_cpuinfo(EPYC), "") == parse_cpuinfo(EPYC)
    monkeypatch.delenv("PLAYGROUND_CPU_KERNELS_MARCH", raising=False)
    monkeypatch.setenv(ISA_VARIABLE, "AVX2")
    assert cpu_isa() == "avx2" and "-march=haswell" in cpu_kernels.compiler_flags()
    monkeypatch.setenv(ISA_VARIABLE, "avx512")
    with pytest.raises(ValueError, match="allowed values are avx2"):
        cpu_isa()
    monkeypatch.delenv(ISA_VARIABLE)
    assert cpu_isa() == "" and "-march=native" in cpu_kernels.compiler_flags()
