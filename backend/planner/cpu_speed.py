"""The embedded engine's speed on a CPU: a decode step and a prefill as the sum of their parts, with per-ISA
rates (speed.py's GPU roofline takes the larger of two bounds; on a CPU the parts do not overlap).

decode step = weights streamed / (cores x a core's streaming rate, capped by the host's bandwidth)
            + batch x 2 x matmul params / (cores x GEMM FLOP/s)          the products
            + batch x KV bytes / (the same streaming rate)               attention's reads
            + layers x (small kernels: norms, RoPE, attention, SiLU; one thread, per row)
            + layers x eager dispatch (only with enforce_eager: no captured step)
            + host work (scheduler, sampler, outputs; per step and per sequence)
prefill = (2 x params without lm_head x tokens + attention FLOPs) / (cores x GEMM FLOP/s x step efficiency)
          + one eager pass's dispatch + host work

Each rate names where it was measured; the README section "How the estimate is computed" lists them and
the benchmark that checks the whole (`python -m backend.bench.planner_speed`).
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.planner.cpu_host import CPUHost, CPUIsa
from backend.planner.specs import ModelSpec

ETA_MEM_CPU = 0.8  # achieved / peak DRAM bandwidth when the host's figure is known (speed.ETA_MEM)
# A prefill step's GEMM FLOPs over cores x the GEMM's one-thread rate: 1,348 prompt tok/s at 2,048 tokens a
# step on 2 cores (quiet, step_profile --prefill-tokens 2048: 286 GFLOP/s of 2 x 205) = 0.70; the rest is
# attention, RoPE, norms and the KV pool's first page writes (README "The prefill step").
PREFILL_STEP_EFFICIENCY = 0.70
EAGER_LAYER_S = 0.12e-3  # enforce_eager: a layer's torch dispatch per step (captured vs eager, see below)
STEP_HOST_S = 0.3e-3  # per step: scheduling, inputs, sampling (stop 28 timers: 0.12 + 0.09 ms + the loop)
SEQUENCE_HOST_S = 30e-6  # per sequence and step: argmax of its logits row (~14 us) and its output
QUANTIZED_GEMM_SHARE = 0.85  # a quantized GEMM's FLOP rate / the dense one's (Q4_1 3072x576 at 16 rows:
# 304 us vs gemm_bf16's 265 us, one thread, README; TTFT of 512 tokens Q4_1 vs bf16 in planner_speed)


@dataclass(slots=True, frozen=True)
class IsaRates:
    """Per-core rates of the engine's kernels on one instruction set, each with its source."""

    gemm_flops: float  # dense GEMM FLOP/s, one thread (bf16 where fast, else fp32)
    dram_bytes_s: float  # bytes/s one core's GEMV streams from DRAM (dense weights, KV)
    quantized_bytes_s: float  # bytes/s one core's quantized GEMV (GGUF/GPTQ blocks) decodes, hot in cache
    layer_s: float  # one layer's small kernels in a batch-1 step, one thread
    layer_row_s: float  # what each further row adds to them
    source: str


# avx512_bf16 is measured on a 2-core AMD EPYC (Zen 4, AVX-512 BF16, no AMX); the others where stated.
ISA_RATES: dict[CPUIsa, IsaRates] = {
    "avx512_bf16": IsaRates(
        gemm_flops=205e9,  # gemm_bf16 at prefill sizes, 205-218 GFLOP/s (README "The prefill step")
        dram_bytes_s=16e9,  # bf16 batch-1 step: 269 MB read ~100 times a second on 2 cores (README)
        quantized_bytes_s=27e9,  # Q4_1 3072x576, 1 row: 1.1 MB in 39-44 us, one thread (README)
        layer_s=37e-6,  # kernel_bench --rows 1 16 --threads 1: 2 add_rms_norm, rope, attention, SiLU
        layer_row_s=7e-6,
        source="2-core AMD EPYC, AVX-512 BF16 (gemm_bf16, interleaved quantized GEMV); measured",
    ),
    "amx": IsaRates(
        gemm_flops=160e9,  # oneDNN with AMX: 512-token TTFT 0.47-0.49 s on a 2-core Xeon (README table)
        dram_bytes_s=16e9,  # not measured on AMX: as the EPYC (unverified)
        quantized_bytes_s=27e9,  # the same AVX-512 BF16 quantized kernels (unverified on AMX)
        layer_s=37e-6,
        layer_row_s=7e-6,
        source="2-core Xeon with AMX: prefill from the README's TTFT; the rest as AVX-512 BF16 (unverified)",
    ),
    "avx512": IsaRates(
        gemm_flops=74e9,  # fp32 (no fast bf16): MKL sgemm 512x576x3072, one thread, AVX-512, this EPYC
        dram_bytes_s=16e9,
        quantized_bytes_s=16e9,  # fp32 products instead of bf16 dot products (unverified)
        layer_s=45e-6,
        layer_row_s=9e-6,
        source="fp32 GEMM measured with MKL_ENABLE_INSTRUCTIONS=AVX512 on the EPYC; the rest estimated",
    ),
    "avx2": IsaRates(
        gemm_flops=68e9,  # fp32: MKL sgemm 512x576x3072, one thread, MKL_ENABLE_INSTRUCTIONS=AVX2, the EPYC
        dram_bytes_s=16e9,
        quantized_bytes_s=13e9,  # the AVX2 quantized paths, half of AVX-512 BF16's (unverified)
        layer_s=55e-6,
        layer_row_s=11e-6,
        source="fp32 GEMM measured with MKL_ENABLE_INSTRUCTIONS=AVX2 on the EPYC; the rest estimated",
    ),
    "baseline": IsaRates(
        gemm_flops=20e9,
        dram_bytes_s=10e9,
        quantized_bytes_s=4e9,
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


def stream_bytes_s(host: CPUHost, is_quantized: bool) -> float:
    """Bytes/s the decode step's GEMVs stream on all cores: each core at its kernel's rate, capped by
    what a core draws from DRAM and by the host's bandwidth when known."""
    rates = ISA_RATES[host.isa]
    per_core = min(rates.dram_bytes_s, rates.quantized_bytes_s) if is_quantized else rates.dram_bytes_s
    total = host.cores * per_core
    if host.memory_bandwidth_bytes_s:
        total = min(total, host.memory_bandwidth_bytes_s * ETA_MEM_CPU)
    return total


def gemm_flops(host: CPUHost, is_quantized: bool) -> float:
    rate = host.cores * ISA_RATES[host.isa].gemm_flops
    return rate * QUANTIZED_GEMM_SHARE if is_quantized else rate


def host_seconds(batch: int) -> float:
    return STEP_HOST_S + batch * SEQUENCE_HOST_S


def decode_step_seconds(
    host: CPUHost, spec: ModelSpec, weights: CPUWeights, batch: int, kv_bytes_per_seq: float, captured: bool
) -> float:
    """Seconds for one decode step of `batch` sequences, each reading kv_bytes_per_seq of KV cache."""
    rates = ISA_RATES[host.isa]
    layers = spec.num_hidden_layers
    streamed = weights.bytes_read / stream_bytes_s(host, weights.is_quantized)
    kv = batch * kv_bytes_per_seq / stream_bytes_s(host, False)
    products = batch * 2 * weights.matmul_params / gemm_flops(host, weights.is_quantized)
    small = layers * (rates.layer_s + (batch - 1) * rates.layer_row_s)
    eager = 0.0 if captured else layers * EAGER_LAYER_S
    return streamed + kv + products + small + eager + host_seconds(batch)


def prefill_seconds(
    host: CPUHost, spec: ModelSpec, weights: CPUWeights, tokens: int, chunk_tokens: int
) -> float:
    """Seconds to prefill one prompt of `tokens` tokens on an idle engine, in chunks of at most chunk_tokens
    (max_num_batched_tokens), each an eager pass that streams the weights once; causal attention."""
    chunks = -(-tokens // max(chunk_tokens, 1))
    params = weights.matmul_params - weights.lm_head_params
    attention = 4 * spec.num_hidden_layers * spec.num_attention_heads * spec.head_dim * tokens * tokens / 2
    flops = 2 * params * tokens + 2 * weights.lm_head_params + attention
    compute = flops / (gemm_flops(host, weights.is_quantized) * PREFILL_STEP_EFFICIENCY)
    per_chunk = weights.bytes_read / stream_bytes_s(host, weights.is_quantized)
    per_chunk += spec.num_hidden_layers * EAGER_LAYER_S + host_seconds(1)
    return compute + chunks * per_chunk
