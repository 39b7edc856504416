"""Roofline speed and cost: prefill is bound by FLOPs, decode by memory bandwidth (weights + KV reads).
The embedded engine on a CPU host has its own model (cpu_speed.py).

Efficiencies are stated constants; the README section "How the estimate is computed" gives their sources
and the error to expect.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.planner.catalog import GPU, Quantization
from backend.planner.specs import ModelSpec

ETA_MEM = 0.8  # achieved / peak memory bandwidth in decode (REFERENCE.md: ~0.8)
ETA_FLOPS = 0.6  # achieved / peak dense tensor FLOPs in prefill and large-batch decode (REFERENCE.md: <= 0.7)
ALLREDUCE_LATENCY_S = 8e-6  # one small all-reduce over NVLink/PCIe (two per layer with tensor parallel)


@dataclass(slots=True, frozen=True)
class Parallel:
    tp: int
    pp: int


def _bytes_of(spec: ModelSpec, quant: Quantization, kind: str) -> float:
    bits = quant.bits if kind in quant.quantized else 16
    return spec.params_by_kind.get(kind, 0) * bits / 8


def matmul_params(spec: ModelSpec) -> int:
    """Parameters multiplied per token: active parameters without the input-embedding lookup."""
    lookup = 0 if spec.tie_word_embeddings else spec.vocab_size * spec.hidden_size
    return spec.params_active - lookup


def expected_experts_touched(spec: ModelSpec, batch: int) -> float:
    """Distinct experts a layer reads for `batch` tokens routed independently to top_k of E experts."""
    e, k = spec.num_experts, spec.num_experts_per_tok
    return e * (1 - (1 - k / e) ** batch)


def decode_bytes_read(spec: ModelSpec, quant: Quantization, weights_total: int, batch: int) -> float:
    """Weight bytes one decode step reads (all GPUs together): everything except untouched experts."""
    read = float(weights_total)
    if not spec.tie_word_embeddings:
        read -= _bytes_of(spec, quant, "embedding") / 2  # the input embedding is a row lookup
    if spec.num_experts:
        experts = _bytes_of(spec, quant, "experts")
        read -= experts * (1 - expected_experts_touched(spec, batch) / spec.num_experts)
    return read


def _attention_flops_per_token(spec: ModelSpec, context: int) -> float:
    """QK^T and PV for one new token against `context` cached tokens (2 matmuls x 2 flops per MAC)."""
    return 4 * spec.num_hidden_layers * spec.num_attention_heads * spec.head_dim * context


def _comm_seconds(spec: ModelSpec, gpu: GPU, par: Parallel, tokens: int) -> float:
    if par.tp == 1:
        return 0.0
    layers = spec.num_hidden_layers / par.pp
    volume = tokens * spec.hidden_size * 2 * 2 * (par.tp - 1) / par.tp  # ring all-reduce of bf16 activations
    bandwidth = gpu.interconnect_bytes_s or 16e9
    return layers * 2 * (ALLREDUCE_LATENCY_S + volume / bandwidth)


def decode_step_seconds(
    spec: ModelSpec,
    quant: Quantization,
    gpu: GPU,
    par: Parallel,
    weights_total: int,
    batch: int,
    kv_bytes_per_seq: float,
    context: int,
) -> float:
    """Seconds for one decode step of `batch` sequences (a token passes every pipeline stage)."""
    gpus = par.tp * par.pp
    read = decode_bytes_read(spec, quant, weights_total, batch) / gpus + batch * kv_bytes_per_seq
    t_mem = read / (gpu.bandwidth_bytes_s * ETA_MEM)
    flops = batch * (2 * matmul_params(spec) + _attention_flops_per_token(spec, context)) / gpus
    t_flops = flops / (gpu.flops(quant.compute) * ETA_FLOPS)
    stage = max(t_mem, t_flops) + _comm_seconds(spec, gpu, par, batch)
    return stage * par.pp


def prefill_seconds(
    spec: ModelSpec, quant: Quantization, gpu: GPU, par: Parallel, weights_total: int, tokens: int
) -> float:
    """Seconds to prefill one prompt of `tokens` tokens on an idle replica (causal attention ~ tokens^2)."""
    gpus = par.tp * par.pp
    flops = 2 * matmul_params(spec) * tokens + _attention_flops_per_token(spec, tokens) * tokens / 2
    t_flops = flops / gpus / (gpu.flops(quant.compute) * ETA_FLOPS)
    t_mem = weights_total / gpus / (gpu.bandwidth_bytes_s * ETA_MEM)
    return (max(t_flops, t_mem) + _comm_seconds(spec, gpu, par, tokens)) * par.pp


def cost_per_million(price_per_gpu_hour: float, num_gpus: int, tokens_per_s: float) -> float | None:
    """USD per 1M tokens at a sustained aggregate rate; None when the rate is zero."""
    if tokens_per_s <= 0:
        return None
    return price_per_gpu_hour * num_gpus / (tokens_per_s * 3600) * 1e6
