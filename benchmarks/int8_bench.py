"""The int8-activation kernels (csrc/int8_dot.h, int8_avx2.h) beside the ones they replace, in one process:

    python -m benchmarks.int8_bench                               # Llama-3.2-1B's shapes, 1-64 rows
    python -m benchmarks.int8_bench --rows 16 --threads 2 --repeat 5

A decode step of Llama-3.2-1B's matrices as llama-quantize's Q4_0 mix stores them (16 layers of Q4_0 q/k/v,
o, gate/up and down, interleaved as the engine lays them out; a Q6_K lm_head), random blocks with sane
scales. The layers' weights rotate through copies (about 140 MB, 4x the L3 cache here) and the lm_head is
215 MB, so they come from DRAM as in a decode step. Each line is the best of --repeat steps (after one
untimed, the two alternating) of the bf16 kernels (int8 paths off) and of the int8 ones, and their ratio
(bf16 time / int8 time: above 1, int8 is faster); cpu_kernels.INT8_Q4_0_MIN_ROWS / INT8_Q6_K_MIN_ROWS are
chosen from it. On an AVX2 build (no AVX-512) the engine computes in fp32 and keeps the blocks as stored:
the columns headed bf16 are then its exact fp32 paths (quant_gemv up to 8 rows, past that the blocks
decoded to fp32 for torch's GEMM, as QuantizedLinear.tiled_matmul), and the int8 columns its Q4_0 layers
in 8-column tiles (column_tiles, csrc/quantized.cpp q4_0x8_gemm) as it loads them; INT8_AVX2_*_MIN_ROWS come
from it. PLAYGROUND_CPU_ISA=avx2 runs the AVX2 kernels on a CPU with AVX-512.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from backend.bench.machine import rerun_with_torch_isa
from backend.engine import cpu_kernels
from backend.engine.quantization import column_tiles
from backend.engine.quantization.column_tiles import ColumnTiles
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.interleaved import Interleaved, interleave
from backend.engine.quantization.quantized_linear import TILE_WEIGHTS

HIDDEN, INTERMEDIATE, KV, VOCAB, LAYERS = 2048, 8192, 512, 128256, 16  # Llama-3.2-1B's config.json
LAYER_SHAPES = {
    "qkv": (HIDDEN + 2 * KV, HIDDEN),
    "o": (HIDDEN, HIDDEN),
    "gate_up": (2 * INTERMEDIATE, HIDDEN),
    "down": (HIDDEN, INTERMEDIATE),
}
COPIES = 4  # layer copies the steps rotate through
HALF_ONE_256TH = 0x1C00  # fp16 2^-8: a sane block scale (random bytes would hold NaNs and infinities)


def random_weight(qtype: str, n: int, k: int, generator: torch.Generator) -> QuantizedWeight:
    """GGUF blocks of random bytes, each block's fp16 d set to 2^-8 (Q4_0: bytes 0-1, Q6_K: 208-209)."""
    block_bytes, block_size, d_at = {"q4_0": (18, 32, 0), "q6_k": (210, 256, 208)}[qtype]
    data = torch.randint(0, 256, (n, k // block_size, block_bytes), dtype=torch.uint8, generator=generator)
    data[..., d_at] = HALF_ONE_256TH & 0xFF
    data[..., d_at + 1] = HALF_ONE_256TH >> 8
    return QuantizedWeight(qtype, data.view(n, -1), (n, k))


def as_stored_product(x: torch.Tensor, weight: QuantizedWeight, out: torch.Tensor, int8_rows: bool) -> None:
    """An AVX2 build's product of GGUF blocks as stored, by the engine's choice of kernel for these rows
    (QuantizedLinear.forward): the int8 rows (int8_rows: set_int8_dot_rows turned them on) or quant_gemv,
    else decoded fp32 and torch's GEMM."""
    rows = x.shape[0]
    if weight.qtype == "q6_k" or rows <= cpu_kernels.QUANT_GEMV_MAX_ROWS:
        kernel = cpu_kernels.quant_gemm if weight.qtype == "q6_k" else cpu_kernels.quant_gemv
        kernel(x, weight.data, weight.qtype, None, out)
    elif int8_rows:
        cpu_kernels.quant_gemm(x, weight.data, weight.qtype, None, out)
    else:  # QuantizedLinear.tiled_matmul: tiles of rows decoded into a cache-sized buffer
        n, k = weight.shape
        tile_rows = max(32, TILE_WEIGHTS // k // 32 * 32)
        tile = torch.empty(tile_rows, k)
        for first in range(0, n, tile_rows):
            last = min(first + tile_rows, n)
            decoded = cpu_kernels.quant_dequant(weight.data[first:last], weight.qtype, tile[: last - first])
            torch.mm(x, decoded.t(), out=out[:, first:last])


def step_calls(
    rows: int,
    layers: Sequence[Mapping[str, Interleaved | ColumnTiles | QuantizedWeight]],
    lm_head: QuantizedWeight,
    int8_rows: bool,
) -> tuple[Callable[[], None], Callable[[], None]]:
    """One decode step's matrix products for rows sequences: (the 16 layers', the lm_head's), the int8 row
    kernels on or off (best_ms sets the kernels' own switch to match)."""
    dtype = torch.bfloat16 if cpu_kernels.int8_dot_available() else torch.float32
    x = {name: torch.randn(rows, shape[1]).to(dtype) for name, shape in LAYER_SHAPES.items()}
    out = {name: torch.empty(rows, shape[0], dtype=dtype) for name, shape in LAYER_SHAPES.items()}
    head_x, logits = torch.randn(rows, HIDDEN).to(dtype), torch.empty(rows, VOCAB, dtype=dtype)

    def layer_products() -> None:
        for layer in range(LAYERS):
            for name, part in layers[layer % len(layers)].items():
                if isinstance(part, Interleaved):
                    cpu_kernels.interleaved_gemm(x[name], part, None, out[name])
                elif isinstance(part, ColumnTiles):
                    cpu_kernels.column_tiles_gemm(x[name], part, None, out[name])
                else:
                    as_stored_product(x[name], part, out[name], int8_rows)

    def head_product() -> None:
        cpu_kernels.quant_gemm(head_x, lm_head.data, "q6_k", None, logits)

    return layer_products, head_product


def best_ms(calls: dict[str, tuple[tuple[int, int], Callable[[], None]]], repeat: int) -> dict[str, float]:
    """The best time of each call (its int8 row setting, the call) over repeat rounds, after an untimed
    one; the calls alternate within a round, so that a busy neighbour slows them alike."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_number in range(repeat + 1):
        for name, (setting, call) in calls.items():
            cpu_kernels.set_int8_dot_rows(*setting)
            start = time.perf_counter()
            call()
            if round_number:
                times[name].append(time.perf_counter() - start)
    return {name: min(values) * 1e3 for name, values in times.items()}


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    kind = cpu_kernels.int8_dot_kind()
    if not kind or (kind == "avx512_vnni" and not cpu_kernels.interleaved_available()):
        print(f"no int8 kernels in this build ({cpu_kernels.build_flags()})")
        return 1
    generator = torch.Generator().manual_seed(0)
    stored = [
        {name: random_weight("q4_0", *shape, generator) for name, shape in LAYER_SHAPES.items()}
        for _ in range(COPIES)
    ]  # AVX2's exact paths read them so; AVX512_VNNI and AVX2's int8 paths, re-laid out as the engine does
    lay_out = interleave if kind == "avx512_vnni" else column_tiles.tile
    layers = [{name: lay_out(weight) for name, weight in copy.items()} for copy in stored]
    exact_layers_of = layers if kind == "avx512_vnni" else stored
    lm_head = random_weight("q6_k", VOCAB, HIDDEN, generator)
    print(f"{args.threads} threads, {cpu_kernels.build_flags()}, int8 kernels: {kind}")
    exact = "bf16" if kind == "avx512_vnni" else "fp32"
    print(f"rows   layers: {exact}     int8  ratio   lm_head: {exact}     int8  ratio   step ratio")
    for rows in args.rows:
        exact_layers, exact_head = step_calls(rows, exact_layers_of, lm_head, int8_rows=False)
        int8_layers, int8_head = step_calls(rows, layers, lm_head, int8_rows=True)
        bf16, int8 = (0, 0), (1, 1)
        ms = best_ms(
            {
                "layers bf16": (bf16, exact_layers),
                "layers int8": (int8, int8_layers),
                "head bf16": (bf16, exact_head),
                "head int8": (int8, int8_head),
            },
            args.repeat,
        )
        layers_bf16, layers_int8 = ms["layers bf16"], ms["layers int8"]
        head_bf16, head_int8 = ms["head bf16"], ms["head int8"]
        print(
            f"{rows:>4} {layers_bf16:>11.1f} {layers_int8:>8.1f} {layers_bf16 / layers_int8:6.2f}"
            f" {head_bf16:>13.1f} {head_int8:>8.1f} {head_bf16 / head_int8:6.2f}"
            f" {(layers_bf16 + head_bf16) / (layers_int8 + head_int8):12.2f}",
            flush=True,
        )
    cpu_kernels.set_int8_dot_rows(*cpu_kernels.int8_dot_rows())
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 8, 16, 32, 64])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="timed steps per figure (the best is shown)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    rerun_with_torch_isa()
    raise SystemExit(main(parse_args()))
