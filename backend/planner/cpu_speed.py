"""The embedded engine's speed on a CPU: a decode step and a prefill as the sum of their parts, with per-ISA
rates (speed.py's GPU roofline is the first part only).

decode step = max(weights read / stream rate,                            the GEMVs: memory or
                  batch x 2 x matmul params / GEMM rate)                  compute, whichever is longer
            + batch x KV bytes / stream rate                             attention's reads
            + layers x (small kernels: norms, RoPE, attention, SiLU; one thread, per row)
            + layers x eager dispatch (only with enforce_eager: no captured step)
            + host work (scheduler, sampler, outputs; per step and per sequence)
prefill = (2 x params without lm_head x tokens + attention FLOPs) / (GEMM rate x step efficiency)
          + per chunk: one eager pass's dispatch and host work

Each rate names where it was measured; the README section "How the estimate is computed" lists them and
the benchmark that checks the whole (`python -m benchmarks.planner_speed`).
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.planner.cpu_host import CPUHost, CPUIsa
from backend.planner.specs import ModelSpec

ETA_MEM_CPU = 0.8  # achieved / peak DRAM bandwidth when the host's figure is known (speed.ETA_MEM)
# DRAM a host without a bandwidth figure gives (this machine): one core alone draws 23-24 GB/s (a one-thread
# Q4_1 batch-1 step: 96.5 MB in 5.6 ms less 1.4 ms of small kernels and host work), all cores ~15 GB/s
# each (two threads, bf16 batch-1 step: 269 MB 84-106 times a second less the same: 27-34 GB/s on two;
# planner_speed 2026-12-02 and README stop 28). 2-core AMD EPYC VM.
DRAM_ONE_CORE_BYTES_S = 24e9
DRAM_PER_CORE_BYTES_S = 15e9
# GEMM FLOP/s on n > 1 threads / n x one thread's: a 2,048-token prefill step, 2,672 ms of one-thread CPU
# time against 1,348 tok/s on two (README "The prefill step").
THREAD_EFFICIENCY = 0.88
# A prefill's GEMM FLOPs / time over the GEMM's own rate: the rest of the step is attention, RoPE, norms
# and the KV pool's first page writes. One thread, 512-token TTFT of bf16: 0.726 s = 164 GFLOP/s of 205.
PREFILL_STEP_EFFICIENCY = 0.80
# enforce_eager: a layer's torch dispatch per step. Captured vs eager, batch 1 (planner_speed --with-eager,
# one and two threads, quiet; README stops 27/28): +2.1 to +7.0 ms a step over 30 layers, 0.07-0.23 ms a
# layer, mostly 0.12-0.23.
EAGER_LAYER_S = 0.18e-3
STEP_HOST_S = 0.3e-3  # per step: scheduling, inputs, sampling (stop 28 timers: 0.12 + 0.09 ms + the loop)
SEQUENCE_HOST_S = 30e-6  # per sequence and step: argmax of its logits row (~14 us) and its output
# A quantized GEMM's FLOP rate / the dense one's, bf16 activations, VDPBF16PS (one thread, planner_speed:
# 512-token TTFT Q4_1 0.905 s vs bf16 0.726 s = 0.80; batch-16 decode products 0.85); AMX: its own
QUANTIZED_GEMM_SHARE = 0.82


@dataclass(slots=True, frozen=True)
class IsaRates:
    """One core's rates for the engine's kernels on one instruction set; `source` says where from."""

    gemm_flops: float  # dense GEMM FLOP/s, one thread (bf16 where fast, else fp32)
    dense_gemv_bytes_s: float  # bytes/s one core's dense GEMV (1-8 rows) streams
    quantized_gemv_bytes_s: float  # bytes/s one core's quantized GEMV (GGUF/GPTQ blocks) decodes
    layer_s: float  # one layer's small kernels in a batch-1 step, one thread
    layer_row_s: float  # what each further row adds to them
    source: str
    quantized_gemm_share: float = QUANTIZED_GEMM_SHARE  # a quantized GEMM's FLOP rate / the dense one's


# avx512_bf16 is measured on a 2-core AMD EPYC (Zen 4, AVX-512 BF16, no AMX); the others where stated.
ISA_RATES: dict[CPUIsa, IsaRates] = {
    "avx512_bf16": IsaRates(
        gemm_flops=205e9,  # gemm_bf16 at prefill sizes, 205-218 GFLOP/s (README "The prefill step")
        dense_gemv_bytes_s=18e9,  # one-thread bf16 batch-1 step: 269 MB in 16.3 ms less 1.4 ms
        quantized_gemv_bytes_s=27e9,  # Q4_1 3072x576, 1 row: 1.1 MB in 39-44 us, one thread (README)
        layer_s=37e-6,  # kernel_bench --rows 1 16 --threads 1: 2 add_rms_norm, rope, attention, SiLU
        layer_row_s=7e-6,
        source="2-core AMD EPYC, AVX-512 BF16 (gemm_bf16, interleaved quantized GEMV); measured",
    ),
    "amx": IsaRates(
        # gemm_bf16 on AMX tiles (csrc/gemm_amx.h): planner_speed on a 2-core Xeon with AMX, 512-token TTFT
        # of the default model in bf16 0.168 s = 118 GFLOP less 6 ms of dispatch, / 0.80 / 0.88 / 2 cores
        gemm_flops=517e9,
        dense_gemv_bytes_s=18e9,  # the same gemm_bf16 GEMV for 1-7 rows: batch-1 bf16 97.1 tok/s measured,
        # 95.9 predicted (planner_speed, same run)
        quantized_gemv_bytes_s=27e9,  # the same AVX-512 BF16 quantized kernels (batch 1: 249 measured, 214
        # predicted: the Xeon's DRAM is faster than the EPYC VM's that dram_bytes_s assumes)
        layer_s=37e-6,
        layer_row_s=7e-6,
        source="2-core Xeon with AMX, planner_speed 2026-12-02: GEMMs on AMX tiles; small kernels as AVX-512",
        # the interleaved quantized GEMM on tiles (csrc/interleaved_amx.h) scales each group's C tile: Q4_1
        # 512-token TTFT 0.283 s vs bf16 0.168 s, less dispatch: 0.585
        quantized_gemm_share=0.585,
    ),
    "avx512": IsaRates(
        gemm_flops=90e9,  # fp32: as AVX2 on the EPYC (Zen 4 runs AVX-512 as two halves; sgemm 62-77 both)
        dense_gemv_bytes_s=18e9,  # fp32 weights through oneDNN / MKL (unverified)
        quantized_gemv_bytes_s=16e9,  # fp32 products instead of bf16 dot products (unverified)
        layer_s=45e-6,
        layer_row_s=9e-6,
        source="fp32 GEMM as AVX2 on the EPYC (an Intel AVX-512 core would be faster); the rest estimated",
    ),
    "avx2": IsaRates(
        gemm_flops=90e9,  # fp32: MKL sgemm 512x576x3072 62-77 GFLOP/s one thread with MKL at AVX2; the
        # engine's own 512-token fp32 prefill (below) ran its whole step at 74
        dense_gemv_bytes_s=16e9,  # fp32 weights through oneDNN / MKL (unverified)
        quantized_gemv_bytes_s=9.5e9,  # AVX2 simulated on the EPYC (haswell kernels, fp32, one thread):
        # captured Q4_1 batch-1 step 82 tok/s, 12.2 ms less 2 ms of small kernels and host
        layer_s=55e-6,
        layer_row_s=11e-6,
        source="AVX2 simulated on the EPYC (haswell kernels, MKL at AVX2, fp32); small kernels estimated",
    ),
    "baseline": IsaRates(
        gemm_flops=20e9,
        dense_gemv_bytes_s=8e9,
        quantized_gemv_bytes_s=4e9,
        layer_s=150e-6,
        layer_row_s=30e-6,
        source="no AVX2: the plain C++ kernels; estimated, not measured",
    ),
}


@dataclass(slots=True, frozen=True)
class CPUWeights:
    """What a step reads and computes: bytes streamed from DRAM, whether they are quantized blocks."""

    bytes_read: float  # weight bytes one decode step streams (the embedding table is only looked up)
    matmul_params: int  # parameters multiplied per token, lm_head included
    lm_head_params: int  # lm_head's share (a prefill computes it for the sampled rows only)
    is_quantized: bool  # runs quantized blocks as stored (the quantized kernels)


def dram_bytes_s(host: CPUHost) -> float:
    """What the host's DRAM gives all cores: 0.8 of its figure, else as measured on the EPYC VM."""
    if host.memory_bandwidth_bytes_s:
        return host.memory_bandwidth_bytes_s * ETA_MEM_CPU
    return max(DRAM_ONE_CORE_BYTES_S, host.cores * DRAM_PER_CORE_BYTES_S)


def stream_bytes_s(host: CPUHost, is_quantized: bool) -> float:
    """Bytes/s the decode step's GEMVs stream on all cores: each at its kernel's rate, capped by DRAM."""
    rates = ISA_RATES[host.isa]
    per_core = rates.quantized_gemv_bytes_s if is_quantized else rates.dense_gemv_bytes_s
    return min(host.cores * per_core, dram_bytes_s(host))


def gemm_flops(host: CPUHost, is_quantized: bool) -> float:
    """GEMM FLOP/s on all cores (threads past the first at THREAD_EFFICIENCY)."""
    rates = ISA_RATES[host.isa]
    rate = host.cores * rates.gemm_flops * (THREAD_EFFICIENCY if host.cores > 1 else 1.0)
    return rate * rates.quantized_gemm_share if is_quantized else rate


def host_seconds(batch: int) -> float:
    return STEP_HOST_S + batch * SEQUENCE_HOST_S


def decode_step_seconds(
    host: CPUHost, spec: ModelSpec, weights: CPUWeights, batch: int, kv_bytes_per_seq: float, captured: bool
) -> float:
    """Seconds for one decode step of `batch` sequences, each reading kv_bytes_per_seq of KV cache."""
    rates = ISA_RATES[host.isa]
    layers = spec.num_hidden_layers
    streamed = weights.bytes_read / stream_bytes_s(host, weights.is_quantized)
    products = batch * 2 * weights.matmul_params / gemm_flops(host, weights.is_quantized)
    kv = batch * kv_bytes_per_seq / stream_bytes_s(host, False)
    small = layers * (rates.layer_s + (batch - 1) * rates.layer_row_s)
    eager = 0.0 if captured else layers * EAGER_LAYER_S
    return max(streamed, products) + kv + small + eager + host_seconds(batch)


def prefill_seconds(
    host: CPUHost, spec: ModelSpec, weights: CPUWeights, tokens: int, chunk_tokens: int
) -> float:
    """Seconds to prefill one prompt of `tokens` tokens on an idle engine, in chunks of at most chunk_tokens
    (max_num_batched_tokens), each an eager pass; causal attention; lm_head for the sampled row only."""
    chunks = -(-tokens // max(chunk_tokens, 1))
    params = weights.matmul_params - weights.lm_head_params
    attention = 4 * spec.num_hidden_layers * spec.num_attention_heads * spec.head_dim * tokens * tokens / 2
    flops = 2 * params * tokens + 2 * weights.lm_head_params + attention
    compute = flops / (gemm_flops(host, weights.is_quantized) * PREFILL_STEP_EFFICIENCY)
    return compute + chunks * (spec.num_hidden_layers * EAGER_LAYER_S + host_seconds(1))
