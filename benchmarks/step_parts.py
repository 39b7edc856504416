"""Labels for step_profile: our own timers around the engine's phases, and names for our ctypes kernels and
the model's attention and MLP in torch.profiler's table (which sees only torch ops otherwise)."""

from __future__ import annotations

import time


class PartTimer:
    """Wraps a few engine methods with wall-clock timers (seconds summed per name)."""

    def __init__(self, engine) -> None:
        self.totals: dict[str, float] = {}
        runner = engine.runner
        self._wrap(runner, "prepare_inputs", "host: token ids, positions, slots")
        self._wrap(runner, "prepare_decode", "host: block tables")
        self._wrap(runner, "prepare_prefill", "host: prefill chunks (PyTorch attention)")
        self._wrap(runner, "prepare_prefill_kernel", "host: prefill chunks (native attention)")
        self._wrap(runner, "run", "forward pass (model + lm_head)")
        if runner.decode_graph is not None:  # decode-only steps: inputs, embedding and the captured calls
            self._wrap(runner.decode_graph, "step_rows", "host: captured step's inputs")
            self._wrap(runner.decode_graph, "run", "captured decode step (copies, embedding, kernels)")
        self._wrap(engine.sampler, "sample", "sampling")
        self._wrap(engine.scheduler, "schedule", "scheduler")

    def _wrap(self, owner, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.totals[label] = self.totals.get(label, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)


def labelled_targets() -> list[tuple[object, str, str]]:
    """(owner, attribute, label) of what label_kernels() wraps."""
    from backend.engine import cpu_kernels
    from backend.engine.layers import attention, mlp

    names = ["paged_decode_attention", "paged_prefill_attention", "rope_and_cache", "rms_norm"]
    names += ["add_rms_norm", "silu_and_mul", "linear_bf16_small", "gemm_bf16", "gemm_bf16_silu_and_mul"]
    names += ["quant_gemv", "quant_gemm", "quant_dequant", "packed_gemv", "interleaved_gemm"]  # quantized
    targets: list[tuple[object, str, str]] = [(cpu_kernels, name, f"cpu_kernels.{name}") for name in names]
    targets += [
        (attention, "paged_attention", "attention (all of it)"),
        (attention, "write_kv_cache", "write_kv_cache (PyTorch)"),
        (attention.Attention, "forward", "Attention.forward (all of it)"),
        (mlp.GatedMLP, "forward", "MLP.forward (all of it)"),
    ]
    return targets


def label_kernels() -> None:
    """Name our ctypes kernels and the model's parts in torch.profiler's table (it sees only torch ops
    otherwise). For a profiling process: the wrappers stay."""
    for owner, name, label in labelled_targets():
        _label(owner, name, label)


def _label(owner, name: str, label: str) -> None:
    import torch

    inner = getattr(owner, name)

    def labelled(*args, **kwargs):
        with torch.profiler.record_function(label):
            return inner(*args, **kwargs)

    setattr(owner, name, labelled)
