"""Microbenchmarks of the native CPU kernels (csrc/) at one model's shapes, beside the torch ops they replace.

    python -m benchmarks.kernel_bench                            # SmolLM2-135M's shapes, 64 and 1 rows
    python -m benchmarks.kernel_bench --rows 64 1 --context 160 --threads 2 --repeat 200
    python -m benchmarks.kernel_bench --only gemm --rows 1 4 16 32 64 128 --threads 1   # GEMMs alone
    python -m benchmarks.kernel_bench --only prefill --rows 2048 --chunk 256 --threads 2   # attention
    python -m benchmarks.kernel_bench --only paged_decode --rows 16 --context 4096 --window 512   # windows

Random tensors, no model loaded: each line is the median time of one call (microseconds) over --repeat
calls after a few warm-up ones, so a kernel's change shows without the noise of a whole decode step.
The GEMM lines (--only gemm) put oneDNN's packed bf16 GEMM (what Linear runs without gemm_bf16) beside
gemm_bf16 at each projection's shape; their weights rotate through copies of about 150 MB (5x the L3
cache here), so they come from DRAM as in a decode step. The prefill lines (--only prefill) put the
native prefill attention of one layer beside what the PyTorch path runs (SDPA per chunk; with a cached
prefix, the blocks gathered and a mask), for rows tokens in chunks of --chunk (x30 layers: a step's).
--window W adds each attention kernel's call with a sliding window of W keys beside the full one, and the
ratio of their times (the windowed layers of Gemma, gpt-oss or Mistral: their cost should follow W).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any


def median_us(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median wall and process-CPU microseconds of one call. With one thread the CPU time is the steadier
    figure on a shared machine: it leaves out the time other processes held the core."""
    for _ in range(max(3, repeat // 10)):
        fn()
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall) * 1e6, statistics.median(cpu) * 1e6


def cases(args: argparse.Namespace, rows: int) -> dict[str, Callable[[], object]]:
    """name -> a call of one kernel (or torch op) on random inputs of rows tokens."""
    import torch
    import torch.nn.functional as F

    from backend.engine import cpu_kernels

    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    hidden, inter, heads, kv_heads = args.hidden, args.intermediate, args.heads, args.kv_heads
    D = args.head_dim
    block_size, context = 16, args.context
    blocks_per_seq = -(-(context + 1) // block_size)
    num_blocks = rows * blocks_per_seq + 1
    k_cache = torch.randn(kv_heads, num_blocks, block_size, D, generator=gen).to(dtype)
    v_cache = torch.randn(kv_heads, num_blocks, block_size, D, generator=gen).to(dtype)
    tables = torch.randperm(num_blocks - 1, generator=gen)[: rows * blocks_per_seq].view(rows, -1) + 1
    lens = torch.full((rows,), context, dtype=torch.long)
    positions = lens - 1
    slots = tables[:, (context - 1) // block_size] * block_size + (context - 1) % block_size
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * D, generator=gen).to(dtype)
    q = qkv.view(rows, -1, D)[:, :heads]
    out = torch.empty(rows, heads, D, dtype=dtype)
    angles = torch.arange(8192)[:, None] * torch.rand(D // 2, generator=gen).repeat(2)[None, :]
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)  # rotations: qkv stays bounded, call after call
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    residual = torch.randn(rows, hidden, generator=gen).to(dtype)
    weight = torch.randn(hidden, generator=gen).to(dtype)
    gate_up = torch.randn(rows, 2 * inter, generator=gen).to(dtype)
    logits = torch.randn(rows, args.vocab, generator=gen).to(dtype)
    logits32 = logits.float()
    fp8 = (k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn))
    scale = D**-0.5
    return {
        "rope_and_cache": lambda: cpu_kernels.rope_and_cache(
            qkv, positions, cos, sin, slots, k_cache, v_cache, heads
        ),
        "rope_and_cache fp8": lambda: cpu_kernels.rope_and_cache(
            qkv, positions, cos, sin, slots, *fp8, heads, (0.5, 2.0)
        ),
        "silu_and_mul": lambda: cpu_kernels.silu_and_mul(gate_up),
        "torch silu * up": lambda: F.silu(gate_up[:, :inter]) * gate_up[:, inter:],
        "add_rms_norm": lambda: cpu_kernels.add_rms_norm(x, residual, weight, 1e-5),
        "rms_norm": lambda: cpu_kernels.rms_norm(x, weight, 1e-5),
        f"paged_decode_attention ctx {context}": lambda: cpu_kernels.paged_decode_attention(
            q, k_cache, v_cache, tables, lens, scale, out
        ),
        f"paged_decode_attention ctx {context} fp8": lambda: cpu_kernels.paged_decode_attention(
            q, *fp8, tables, lens, scale, out, (0.5, 2.0)
        ),
        **(
            {
                f"paged_decode_attention ctx {context} window {args.window}": functools.partial(
                    cpu_kernels.paged_decode_attention,
                    *(q, k_cache, v_cache, tables, lens, scale, out),
                    sliding_window=args.window,
                )
            }
            if args.window
            else {}
        ),
        "logits bf16 -> fp32": lambda: logits.float(),
        "logits .float().argmax(-1)": lambda: logits.float().argmax(-1),
        "logits argmax (bf16)": lambda: logits.argmax(-1),
        "logits .float() + cpu_kernels.argmax": lambda: cpu_kernels.argmax(logits.float()),
        "cpu_kernels.argmax (fp32)": lambda: cpu_kernels.argmax(logits32),
        "torch argmax (fp32)": lambda: logits32.argmax(-1),
    }


def gemm_cases(args: argparse.Namespace, rows: int) -> dict[str, Callable[[], object]]:
    """oneDNN's packed GEMM and gemm_bf16 at the projections' shapes; each call takes the next weight copy."""
    import itertools

    import torch

    from backend.engine import cpu_kernels

    hidden, inter, q_size = args.hidden, args.intermediate, args.heads * args.head_dim
    qkv = q_size + 2 * args.kv_heads * args.head_dim
    shapes = {"qkv": (hidden, qkv), "o": (q_size, hidden), "gate_up": (hidden, 2 * inter)}
    shapes |= {"down": (inter, hidden), "lm_head": (hidden, args.vocab)}
    linear = torch.ops.mkldnn._linear_pointwise.default
    out: dict[str, Callable[[], object]] = {}
    for name, (k, n) in shapes.items():
        weights = [torch.randn(n, k).bfloat16() for _ in range(max(1, min(30, int(150e6 // (2 * k * n)))))]
        x = torch.randn(rows, k).bfloat16()
        label = f"gemm {name} {k}->{n}"
        onednn = itertools.cycle([torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights])
        out[f"{label} oneDNN"] = functools.partial(_onednn_gemm, linear, x, onednn)
        if cpu_kernels.gemm_bf16_enabled():
            native = itertools.cycle([cpu_kernels.gemm_bf16_pack(w) for w in weights])
            out[f"{label} gemm_bf16"] = functools.partial(_native_gemm, x, native, n)
        if (amx := cpu_kernels.gemm_amx_min_rows()) > 0:  # the same call held to one path: tiles, VDPBF16PS
            out[f"{label} gemm_bf16 AMX"] = functools.partial(_native_gemm, x, native, n, amx_from=(1, amx))
            out[f"{label} gemm_bf16 AVX-512"] = functools.partial(
                _native_gemm, x, native, n, amx_from=(0, amx)
            )
        if cpu_kernels.gemm_bf16_enabled() and name == "gate_up":  # the MLP's two calls, and its one
            two_calls = functools.partial(_native_gemm, x, native, n, silu=True)
            out[f"{label} gemm_bf16 + silu_and_mul"] = two_calls
            fused = itertools.cycle([cpu_kernels.pack_gate_up(w, None)[0] for w in weights])
            out[f"{label} gemm_bf16_silu_and_mul"] = functools.partial(_fused_gemm, x, fused, n)
    return out


def prefill_cases(args: argparse.Namespace, rows: int) -> dict[str, Callable[[], object]]:
    """One layer's attention for a prefill step of rows tokens in chunks of args.chunk, each chunk alone or
    after a cached prefix of args.chunk tokens: the native kernel beside the PyTorch path's calls."""
    import torch

    from backend.engine import cpu_kernels
    from backend.engine.attention import paged_attention
    from backend.engine.cpu_kernels import PrefillKernelInputs

    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, D, block_size, n = args.heads, args.kv_heads, args.head_dim, 16, args.chunk
    num_chunks, blocks_per_seq = rows // n, -(-2 * n // block_size)
    num_blocks = num_chunks * blocks_per_seq + 1
    k_cache = torch.randn(kv_heads, num_blocks, block_size, D, generator=gen).bfloat16()
    v_cache = torch.randn(kv_heads, num_blocks, block_size, D, generator=gen).bfloat16()
    tables = torch.randperm(num_blocks - 1, generator=gen)[: num_chunks * blocks_per_seq] + 1
    tables = tables.view(num_chunks, blocks_per_seq)
    qkv = torch.randn(num_chunks * n, (heads + 2 * kv_heads) * D, generator=gen).bfloat16()
    q, k, v = qkv.view(num_chunks * n, -1, D).split([heads, kv_heads, kv_heads], dim=1)
    scale = D**-0.5
    out: dict[str, Callable[[], object]] = {}
    for cached in (0, n):
        starts = torch.arange(0, num_chunks * n + 1, n)
        kernel = PrefillKernelInputs(starts, torch.full((num_chunks,), cached + n), tables)
        meta = torch_prefill_metadata(tables, k_cache, n, cached)
        label = f"{num_chunks}x{n}" + (f" +{cached} cached" if cached else "")
        out[f"prefill attention {label} native"] = functools.partial(
            cpu_kernels.paged_prefill_attention, q, k_cache, v_cache, kernel, scale, torch.empty_like(q)
        )
        if args.window:
            out[f"prefill attention {label} native window {args.window}"] = functools.partial(
                cpu_kernels.paged_prefill_attention,
                *(q, k_cache, v_cache, kernel, scale, torch.empty_like(q)),
                sliding_window=args.window,
            )
        out[f"prefill attention {label} torch"] = functools.partial(
            paged_attention, q, k, v, k_cache, v_cache, meta, scale
        )
    return out


def torch_prefill_metadata(tables: Any, k_cache: Any, n: int, cached: int) -> Any:
    """AttentionMetadata of chunks of n tokens after cached ones, as ModelRunner.prepare_prefill builds it."""
    import torch

    from backend.engine.attention import AttentionMetadata, PrefillChunk, pool_rows

    chunks = []
    kv_heads, num_blocks, block_size, head_dim = k_cache.shape
    for i, table in enumerate(tables.tolist()):
        if not cached:
            chunks.append(PrefillChunk(i * n, (i + 1) * n, 0, None, None))
            continue
        mask = torch.arange(cached + n)[None, :] <= torch.arange(cached, cached + n)[:, None]
        used = table[: -(-(cached + n) // block_size)]
        rows = pool_rows(used, kv_heads, num_blocks, mask.device)
        chunks.append(PrefillChunk(i * n, (i + 1) * n, cached, rows, mask))
    size = tables.shape[1] * kv_heads * block_size * head_dim
    buffers = (torch.empty(size, dtype=torch.bfloat16), torch.empty(size, dtype=torch.bfloat16))
    empty = torch.empty(0, dtype=torch.int64)
    return AttentionMetadata(empty, empty, 0, None, None, None, None, chunks, None, buffers)


def _onednn_gemm(linear: Callable[..., object], x: Any, weights: Iterator[Any]) -> object:
    return linear(x, next(weights), None, "none", [], "")


def _native_gemm(
    x: Any, weights: Iterator[Any], n: int, silu: bool = False, amx_from: tuple[int, int] | None = None
) -> object:
    """gemm_bf16; amx_from (rows, default): AMX tiles from that many rows for this call (0: never), the
    library's default restored after; None: the default call."""
    from backend.engine import cpu_kernels

    if amx_from is None:  # the default call, untouched
        out = cpu_kernels.gemm_bf16(x, next(weights), n, None)
        return cpu_kernels.silu_and_mul(out) if silu else out
    library = cpu_kernels.load_library()
    assert library is not None
    library.gemm_amx_set_min_rows(amx_from[0])
    try:
        return cpu_kernels.gemm_bf16(x, next(weights), n, None)
    finally:
        library.gemm_amx_set_min_rows(amx_from[1])


def _fused_gemm(x: Any, weights: Iterator[Any], n: int) -> object:
    from backend.engine import cpu_kernels

    return cpu_kernels.gemm_bf16_silu_and_mul(x, next(weights), n, None)


def main(args: argparse.Namespace) -> int:
    import torch

    from backend.bench.machine import cpu_summary

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(cpu_summary())
    torch.set_grad_enabled(False)
    for rows in args.rows:
        print(f"\n{rows} rows (median of {args.repeat} calls){'':<12}wall us    CPU us")
        only = set(args.only or ())
        chosen = {} if only == {"prefill"} else cases(args, rows)
        chosen |= (gemm_cases(args, rows) if "gemm" in only else {}) | (
            prefill_cases(args, rows) if "prefill" in only else {}
        )
        timed: dict[str, float] = {}
        for name, fn in chosen.items():
            if args.only and not any(word in name for word in args.only):
                continue
            wall, cpu = median_us(fn, args.repeat)
            timed[name] = wall
            print(f"  {name:<42} {wall:9.1f} {cpu:9.1f}", flush=True)
        suffix = f" window {args.window}"
        for name, wall in timed.items():
            if name.endswith(suffix) and name.removesuffix(suffix) in timed:
                full = timed[name.removesuffix(suffix)]
                print(f"  {name}: {wall / full:.3f}x the full context's time", flush=True)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 1], help="tokens (sequences) per call")
    parser.add_argument("--context", type=int, default=160, help="tokens each sequence attends to")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--only", nargs="*", help="only the cases whose name holds one of these words")
    parser.add_argument("--chunk", type=int, default=256, help="tokens per prefill chunk (--only prefill)")
    parser.add_argument("--window", type=int, default=0, help="also time attention with this sliding window")
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49152)
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main(parse_args()))
