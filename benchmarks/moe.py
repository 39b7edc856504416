"""One MoE layer's routed experts on the native kernel (csrc/moe.cpp), random weights at a real model's shape.

    python -m benchmarks.moe                              # OLMoE-1B-7B and Qwen3-30B-A3B, Q4_0, 1 and 16 rows
    python -m benchmarks.moe --shape olmoe --rows 1 4 16 64 --threads 2 --repeat 50
    python -m benchmarks.moe --qtype q8_0 --shape qwen3                  # another type the engine interleaves

Each line is the median time of one call of the layer (router GEMM + routing + every routed expert + combine)
over --repeat calls of fresh random tokens each, after warm-up calls: wall time, and the process's CPU time
(with --threads 1 the steadier figure on a shared machine: it leaves out the time other processes held the
core; the rates are the wall time's). Weights are random GGUF blocks (fp16
scales of a trained model's size, random quants), interleaved for the kernel as a model load lays them out;
the router is random, so tokens spread over the experts as routing a real model's tokens roughly does.
Printed: tokens/s (rows / time), the expert weights the call read (the distinct experts routed, each
read once) over the time (effective bandwidth), and the experts' GFLOP/s (2 x rows x top_k x 3 x H x I).
This is the base the side-by-side comparison with llama.cpp (its MUL_MAT_ID at the same shape) builds on.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

SHAPES = {  # config.json of each model: num_experts, top_k, hidden_size, the experts' intermediate size
    "olmoe": (64, 8, 2048, 1024),  # allenai/OLMoE-1B-7B-0924
    "qwen3": (128, 8, 2048, 768),  # Qwen/Qwen3-30B-A3B (moe_intermediate_size)
}


@dataclass(slots=True)
class Result:
    shape: str
    rows: int
    median_us: float  # wall
    median_cpu_us: float  # the process's CPU time
    expert_bytes: float  # weights the median call read (distinct experts routed x one expert's bytes)

    def line(self, flops_per_row: float) -> str:
        seconds = self.median_us / 1e6
        rate = f"{self.rows / seconds:8.1f} tok/s  {self.expert_bytes / seconds / 1e9:5.1f} GB/s"
        flops = flops_per_row * self.rows / seconds / 1e9
        timing = f"{self.median_us:8.0f} us (CPU {self.median_cpu_us:8.0f} us)"
        return f"{self.shape:6} rows {self.rows:3}  {timing}  {rate}  {flops:6.1f} GFLOP/s"


def random_blocks(qtype: str, rows: int, cols: int, generator):
    """[rows, cols / 32 * block bytes] uint8 GGUF blocks: random quants, fp16 scales near 0.01."""
    import torch

    from backend.engine.quantization.gguf_blocks import block_shape

    per_block, block_bytes = block_shape(qtype)
    blocks = torch.randint(
        0, 256, (rows, cols // per_block, block_bytes), dtype=torch.uint8, generator=generator
    )
    scales = (torch.rand(rows, cols // per_block, 2, generator=generator) * 0.01 + 0.005).half()
    head = (
        4 if qtype in ("q4_1", "q4_k") else 2
    )  # d (and m / dmin); Q6_K keeps d last: not a kept MoE bench type
    blocks[..., :head] = scales.view(torch.uint8).view(rows, cols // per_block, 4)[..., :head]
    return blocks.reshape(rows, -1)


def build_layer(shape: str, qtype: str):
    import torch

    from backend.engine.layers.fused_moe import FusedMoE, MoEConfig
    from backend.engine.quantization.gguf_reader import QuantizedWeight

    experts, top_k, hidden, inter = SHAPES[shape]
    generator = torch.Generator().manual_seed(0)
    config = MoEConfig(experts, top_k, hidden, inter, "softmax_topk", renormalize=True)
    layer = FusedMoE(config)
    with torch.no_grad():
        layer.gate.weight.copy_(torch.randn(experts, hidden, generator=generator) / hidden**0.5)
    w13 = random_blocks(qtype, experts * 2 * inter, hidden, generator)
    w2 = random_blocks(qtype, experts * hidden, inter, generator)
    layer.set_quantized_experts(
        QuantizedWeight(qtype, w13, (experts * 2 * inter, hidden)),
        QuantizedWeight(qtype, w2, (experts * hidden, inter)),
    )
    layer = layer.to(torch.bfloat16)
    layer.gate.prepare()
    layer.prepare_experts(use_kernels=True)
    if layer.native is None:
        raise SystemExit("the native MoE kernel does not serve this CPU / build (see cpu_kernels)")
    expert_bytes = (w13.nbytes + w2.nbytes) / experts
    return layer, expert_bytes


def measure(layer, shape: str, rows: int, repeat: int, expert_bytes: float) -> Result:
    import torch

    hidden = layer.config.hidden_size
    generator = torch.Generator().manual_seed(rows)
    inputs = [torch.randn(rows, hidden, generator=generator).bfloat16() for _ in range(8)]
    times, cpu_times, distinct = [], [], []
    with torch.inference_mode():
        for i in range(max(3, repeat // 10) + repeat):
            x = inputs[i % len(inputs)]
            start, start_cpu = time.perf_counter(), time.process_time()
            layer(x)
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - start_cpu)
            ids = torch.topk(layer.gate(x).float(), layer.config.top_k, dim=-1).indices
            distinct.append(ids.unique().numel())
    warm = max(3, repeat // 10)
    wall, cpu = statistics.median(times[warm:]) * 1e6, statistics.median(cpu_times[warm:]) * 1e6
    return Result(shape, rows, wall, cpu, statistics.median(distinct) * expert_bytes)


def dense_baseline(shape: str, qtype: str, repeat: int) -> tuple[float, float]:
    """(wall, CPU) median microseconds of one token through top_k experts' weights as two plain
    interleaved_gemm calls (the experts' gate_up rows stacked, then their down columns side by side), eight
    copies in turn so that they come from DRAM as the layer's do: what the layer's grouping costs on top."""
    import torch

    from backend.engine import cpu_kernels
    from backend.engine.quantization.gguf_reader import QuantizedWeight
    from backend.engine.quantization.interleaved import interleave

    _, top_k, hidden, inter = SHAPES[shape]
    generator = torch.Generator().manual_seed(1)

    def weight(rows: int, cols: int):
        return interleave(QuantizedWeight(qtype, random_blocks(qtype, rows, cols, generator), (rows, cols)))

    copies = [(weight(top_k * 2 * inter, hidden), weight(hidden, top_k * inter)) for _ in range(8)]
    x, act = torch.randn(1, hidden, generator=generator).bfloat16(), torch.randn(1, top_k * inter).bfloat16()
    gate_up, out = (
        torch.empty(1, top_k * 2 * inter, dtype=torch.bfloat16),
        torch.empty(1, hidden, dtype=torch.bfloat16),
    )
    times, cpu_times = [], []
    for i in range(max(3, repeat // 10) + repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        cpu_kernels.interleaved_gemm(x, copies[i % 8][0], None, gate_up)
        cpu_kernels.interleaved_gemm(act, copies[i % 8][1], None, out)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - start_cpu)
    warm = max(3, repeat // 10)
    return statistics.median(times[warm:]) * 1e6, statistics.median(cpu_times[warm:]) * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    parser.add_argument("--qtype", default="q4_0", help="a GGUF type the engine keeps (q4_0, q4_1, q8_0)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16], help="tokens a call")
    parser.add_argument("--threads", type=int, default=None, help="torch / OpenMP threads (default: torch's)")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)
    import torch

    from backend.bench.machine import cpu_summary

    if args.threads:
        torch.set_num_threads(args.threads)
    print(cpu_summary())
    for shape in SHAPES if args.shape == "all" else [args.shape]:
        layer, expert_bytes = build_layer(shape, args.qtype)
        _, top_k, hidden, inter = SHAPES[shape]
        print(f"{shape}: {SHAPES[shape]} (experts, top_k, hidden, intermediate), {args.qtype}, "
              f"experts' weights {expert_bytes * SHAPES[shape][0] / 1e6:.0f} MB, "
              f"kernels {layer.native.gate_up.function} / {layer.native.down.function}")  # fmt: skip
        for rows in args.rows:
            result = measure(layer, shape, rows, args.repeat, expert_bytes)
            print(result.line(2.0 * top_k * 3 * hidden * inter))
            if rows == 1 and args.qtype in ("q4_0", "q4_1", "q8_0"):
                wall, cpu = dense_baseline(shape, args.qtype, args.repeat)
                ratio = result.median_cpu_us / cpu
                print(f"{shape:6} rows   1  {wall:8.0f} us (CPU {cpu:8.0f} us)  the same bytes in two plain "
                      f"interleaved_gemm calls; the layer: {ratio:.2f}x their CPU time")  # fmt: skip
        del layer


if __name__ == "__main__":
    main()
