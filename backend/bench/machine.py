"""The machine line every benchmark prints beside its figures: the same step is 3x apart between CPUs."""

from __future__ import annotations

import os
import sys

from backend.cpu_features import cpu_features, cpu_isa


def cpu_summary() -> str:
    """CPU model name, cores torch uses, and the instruction sets that pick our kernels."""
    import torch

    from backend.engine import cpu_kernels
    from backend.engine.device import cpu_has_fast_bf16

    name = cpu_features().model_name
    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f"CPU {name}; torch threads {torch.get_num_threads()}; torch capability {capability}; "
        f"fast bf16 {cpu_has_fast_bf16()}; {cpu_kernels.build_flags()}"
    )


def rerun_with_torch_isa() -> None:
    """Under PLAYGROUND_CPU_ISA=avx2, run this command again with torch's own kernels on AVX2 as well
    (ATEN_CPU_CAPABILITY, read once torch loads): the whole process then acts as an AVX2 machine."""
    if cpu_isa() == "avx2" and os.environ.get("ATEN_CPU_CAPABILITY") != "avx2":
        env = os.environ | {"ATEN_CPU_CAPABILITY": "avx2"}
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
