"""Quantized weights as stored against the same checkpoint dequantized at load: one process, the same
engine settings and workload, runs interleaved (A B B A) on a shared machine, medians reported.

Part of `python -m backend.bench.offline` (skip it with --skip quant): batch-1 decode tokens/s and the
continuous-batching throughput of both, the weight bytes each holds, and the instruction sets the CPU
kernels were built for.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass


@dataclass(slots=True)
class Table:
    title: str
    rows: dict[str, float]
    lower: bool = False  # lower values are better


def _decode_seconds(llm, prompt: list[int], tokens: int) -> float:
    from backend.engine import SamplingParams

    start = time.perf_counter()
    (out,) = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == tokens
    return time.perf_counter() - start


def decode_rates(engines: dict, prompt: list[int], tokens: int, repeats: int) -> dict[str, float]:
    """Batch-1 tokens/s of each engine: (time for N tokens - time for 1) / (N - 1), medians, engines
    taking turns within every repeat."""
    many: dict[str, list[float]] = {name: [] for name in engines}
    one: dict[str, list[float]] = {name: [] for name in engines}
    for llm in engines.values():
        _decode_seconds(llm, prompt, tokens)  # warm-up
    for repeat in range(repeats):
        order = list(engines) if repeat % 2 == 0 else list(reversed(engines))
        for name in order:
            many[name].append(_decode_seconds(engines[name], prompt, tokens))
            one[name].append(_decode_seconds(engines[name], prompt, 1))
    return {
        name: (tokens - 1) / (statistics.median(many[name]) - statistics.median(one[name]))
        for name in engines
    }


def throughputs(engines: dict, work, run_engine, repeats: int) -> dict[str, float]:
    """Output tokens/s of each engine on the workload, medians of runs in A B B A order."""
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for repeat in range(repeats):
        order = list(engines) if repeat % 2 == 0 else list(reversed(engines))
        for name in order:
            seconds[name].append(run_engine(engines[name], work))
    return {name: work.output_tokens / statistics.median(times) for name, times in seconds.items()}


def compare(llm, args: argparse.Namespace, work, run_engine) -> list[Table]:
    """Tables for print_table: llm runs the model as stored; a second engine dequantizes it at load.
    work is offline.Workload, run_engine offline.run_engine (passed in: offline imports this module)."""
    from backend.engine import LLM, cpu_kernels

    stats = llm.stats()
    if stats.quantization is None:
        print("\nQuantized vs dequantized: skipped, the checkpoint is not quantized", flush=True)
        return []
    dense = LLM(llm.llm_engine.config.model, dtype=args.dtype, device=args.device,
                max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                dequantize_weights=True)  # fmt: skip
    stored_name, dense_name = f"as stored ({stats.quantization})", f"dequantized to {args.dtype}"
    engines = {stored_name: llm, dense_name: dense}
    print(f"\nQuantized vs dequantized, {cpu_kernels.build_flags()}", flush=True)
    weights = {name: e.stats().weights_bytes / 1e6 for name, e in engines.items()}
    rates = decode_rates(engines, work.prompts[0][:32], args.decode_tokens, args.quant_repeats)
    rates_title = f"Batch-1 decode (tokens/s, medians of {args.quant_repeats} interleaved runs)"
    batched = throughputs(engines, work, run_engine, max(2, args.quant_repeats // 2))
    return [
        Table("Weights held (MB, lower is better)", weights, lower=True),
        Table(rates_title, rates),
        Table("Continuous-batching throughput (output tokens/s, medians, A B B A)", batched),
    ]
