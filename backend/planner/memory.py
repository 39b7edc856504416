"""Where the memory of one GPU goes: weights, KV cache, activations, runtime overhead, CUDA graphs.

Every function is pure. Figures are per GPU unless a name says otherwise. Each engine's accounting is
in kv_budget_bytes(); the constants below are explained, with their sources, in the README
("How the estimate is computed").
"""

from __future__ import annotations

import math

from backend.planner.catalog import GIB, Quantization
from backend.planner.specs import ModelSpec

# vLLM's non-torch memory (CUDA context, cuBLAS workspaces, NCCL / custom all-reduce buffers). Measured
# 0.35 GiB (RTX 3090, TP=1) in vllm#10517; TP>1 adds NCCL buffers (vllm#10511 logs 1.8 GiB more at TP=2).
NON_TORCH_BYTES = int(0.4 * GIB)
NON_TORCH_MULTI_GPU_BYTES = int(1.0 * GIB)
# vLLM's profile run samples max_num_seqs dummy requests: fp32 logits plus one same-sized temporary.
LOGITS_COPIES = 2
# CUDA graphs (vLLM captures decode batch sizes up to 512): a fixed part plus a share per layer.
CUDA_GRAPH_BASE_BYTES = int(0.1 * GIB)
CUDA_GRAPH_PER_LAYER_BYTES = 12 * 1024**2
# The embedded engine (backend/engine/device.py): KV pool = min(20% of available RAM, 2 GiB) on CPU,
# 85% of free memory after the weights on a GPU.
EMBEDDED_CPU_KV_SHARE, EMBEDDED_CPU_KV_CAP = 0.2, 2 * GIB
EMBEDDED_GPU_KV_SHARE = 0.85
# llama.cpp: CUDA context plus compute buffers for one micro-batch (-ub 512).
LLAMACPP_UBATCH = 512


def weight_bytes_total(spec: ModelSpec, quant: Quantization) -> int:
    """All weights a server loads for this quantization (DeepSeek's MTP layer is not loaded by default)."""
    if spec.weights_exact and quant.name == spec.checkpoint_dtype:
        return spec.weights_bytes
    total = 0.0
    for kind, params in spec.params_by_kind.items():
        if kind == "mtp":
            continue
        bits = quant.bits if kind in quant.quantized else 16
        total += params * bits / 8
    return int(total)


def weight_bytes_per_gpu(spec: ModelSpec, quant: Quantization, tp: int, pp: int) -> int:
    """TP shards every matrix (embeddings are vocab-parallel); pipeline parallel splits the layers."""
    return math.ceil(weight_bytes_total(spec, quant) / (tp * pp))


def kv_heads_per_gpu(spec: ModelSpec, tp: int) -> int:
    return max(spec.num_key_value_heads // tp, 1)  # vLLM replicates KV heads when TP > num_kv_heads


def kv_bytes_per_token_layer(spec: ModelSpec, kv_bytes: float, tp: int) -> float:
    """One token, one layer, one GPU. MLA caches one compressed latent, replicated on every TP rank."""
    if spec.attention == "mla":
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * kv_bytes
    return 2 * kv_heads_per_gpu(spec, tp) * spec.head_dim * kv_bytes


def layers_per_gpu(spec: ModelSpec, pp: int) -> tuple[int, int]:
    """(full-attention layers, sliding-window layers) held by the largest pipeline stage."""
    sliding = spec.num_sliding_layers
    full = spec.num_hidden_layers - sliding
    return math.ceil(full / pp), math.ceil(sliding / pp)


def kv_bytes_per_token(spec: ModelSpec, kv_bytes: float, tp: int, pp: int) -> float:
    """KV bytes one token costs on one GPU while the context is shorter than every window."""
    full, sliding = layers_per_gpu(spec, pp)
    return (full + sliding) * kv_bytes_per_token_layer(spec, kv_bytes, tp)


def kv_tokens_per_layer(spec: ModelSpec, seq_len: int) -> list[int]:
    """Tokens each layer keeps for one sequence: sliding-window layers keep at most the window."""
    window = spec.sliding_window or seq_len
    return [min(seq_len, window) if t == "sliding_attention" else seq_len for t in spec.layer_types]


def kv_bytes_per_sequence(
    spec: ModelSpec, seq_len: int, kv_bytes: float, tp: int, pp: int, block: int
) -> int:
    """KV bytes of one seq_len-token sequence on one GPU, in whole blocks (sliding layers: window + 1)."""
    full, sliding = layers_per_gpu(spec, pp)
    per_layer = kv_bytes_per_token_layer(spec, kv_bytes, tp)
    blocks_full = math.ceil(seq_len / block)
    window = spec.sliding_window or seq_len
    blocks_sliding = min(blocks_full, math.ceil(window / block) + 1)
    return int((full * blocks_full + sliding * blocks_sliding) * block * per_layer)


def activation_bytes(spec: ModelSpec, tokens: int, tp: int, max_num_seqs: int, act_bytes: int = 2) -> int:
    """Peak activation of a forward pass over `tokens` tokens (vLLM's profile run) plus sampler logits.

    Dense MLP: the gate/up output (2I) and the activated product (I), sharded by TP, plus two hidden-size
    buffers. MoE: the fused-MoE caches hold top_k copies of those. Validated in tests/test_planner_vllm.py.
    """
    hidden = spec.hidden_size
    if spec.num_experts:
        k = spec.num_experts_per_tok
        per_token = 3 * spec.moe_intermediate_size * k / tp + k * hidden + 2 * hidden
    else:
        per_token = 3 * spec.intermediate_size / tp + 2 * hidden
    logits = max_num_seqs * spec.vocab_size * 4 * LOGITS_COPIES
    return int(tokens * per_token * act_bytes + logits)


def cuda_graph_bytes(spec: ModelSpec, pp: int) -> int:
    return CUDA_GRAPH_BASE_BYTES + CUDA_GRAPH_PER_LAYER_BYTES * math.ceil(spec.num_hidden_layers / pp)


def non_torch_bytes(num_gpus_per_replica: int) -> int:
    return NON_TORCH_BYTES + (NON_TORCH_MULTI_GPU_BYTES if num_gpus_per_replica > 1 else 0)


def kv_budget_bytes(
    engine: str, usable: int, utilization: float, weights: int, activation: int, overhead: int, on_cpu: bool
) -> int:
    """KV cache bytes an engine allocates on one GPU, following that engine's own accounting.

    vllm / mii / tgi: a utilization budget, minus weights, profiled activation and non-torch memory.
    sglang: --mem-fraction-static covers weights + KV pool; activations live outside it.
    trtllm: kv_cache_free_gpu_memory_fraction of what is free after weights and activations.
    embedded: backend/engine/device.py (a share of RAM, capped, on CPU; 85% of free memory on a GPU).
    llama.cpp / ollama allocate exactly the context they are given: see estimate.py.
    """
    if engine == "embedded":
        if on_cpu:
            return int(min(usable * EMBEDDED_CPU_KV_SHARE, EMBEDDED_CPU_KV_CAP))
        return int(max(usable - weights - overhead, 0) * EMBEDDED_GPU_KV_SHARE)
    if engine == "sglang":
        return int(usable * utilization) - weights
    if engine == "trtllm":
        return int(max(usable - weights - activation - overhead, 0) * utilization)
    return int(usable * utilization) - weights - activation - overhead
