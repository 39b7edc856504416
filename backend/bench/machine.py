"""The machine line every benchmark prints beside its figures: the same step is 3x apart between CPUs."""

from __future__ import annotations

from backend.cpu_features import cpu_features


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
