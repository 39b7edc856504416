"""Where the memory of one GPU goes: weights, KV cache, activations, runtime overhead, CUDA graphs.

Every function is pure. Figures are per GPU unless a name says otherwise. Each engine's accounting is
in kv_budget_bytes() (vLLM's, by version, in memory_plan.py); the constants below are explained, with
their sources, in the README ("How the estimate is computed").
"""

from __future__ import annotations

import math

from backend.planner import vllm_versions
from backend.planner.catalog import GIB, Quantization
from backend.planner.specs import ModelSpec

# vLLM's non-torch memory (NCCL and custom all-reduce buffers, cuBLAS workspaces; the CUDA context is
# outside its budget). V0 logs print it: 0.01 GiB (T4), 0.05 (A10), 0.08 (L40S), 0.09 (V100), 0.10
# (RTX 3090), 0.26 (A100) at TP=1; 0.25 GiB with TP=2 (vllm#13061) and 0.20 with TP=4 (vllm#14447).
NON_TORCH_BYTES = int(0.08 * GIB)
NON_TORCH_MULTI_GPU_BYTES = int(0.25 * GIB)
# The profile's dummy sampler run, up to vLLM 0.16 (later families: vllm_versions.VllmFamily).
SAMPLER_BYTES_PER_LOGIT = vllm_versions.SORT_SAMPLER_BYTES_PER_LOGIT
# Other engines: fp32 logits plus one same-sized temporary per sequence.
LOGIT_BYTES_OTHER = 8
# CUDA graphs (vLLM captures decode batch sizes up to 512): a fixed part plus a share per layer. Logged:
# "Graph capturing finished ... took 1.22 GiB" (Llama-3-70B AWQ, 80 layers, TP=2, vLLM 0.16), 0.80 GiB
# (28 layers, V0, V100), 0.18 GiB (28 layers, V0, L4-class). vLLM >= 0.21 subtracts its own estimate:
# "Estimated CUDA graph memory: 0.52 GiB" for Qwen3-8B (36 layers, 51 piecewise + 35 full graphs, vLLM
# 0.21.0, LMCache/LMCache#3430). vLLM 0.19 on H100s with 1024 sequences (51 + 51 graphs) estimates more:
# 0.61-0.84 GiB for 28-36 layers, 1.6-1.9 GiB for 80 (llm-d-planner results_raw.csv). The formula gives
# 1.04 / 0.43 / 0.43 / 0.52 / 0.43-0.52 / 1.04 GiB: a rough term.
CUDA_GRAPH_BASE_BYTES = int(0.1 * GIB)
CUDA_GRAPH_PER_LAYER_BYTES = 12 * 1024**2
# The embedded engine (backend/engine/device.py): KV pool = min(20% of available RAM, 2 GiB) on CPU,
# 85% of free memory after the weights on a GPU.
EMBEDDED_CPU_KV_SHARE, EMBEDDED_CPU_KV_CAP = 0.2, 2 * GIB
EMBEDDED_GPU_KV_SHARE = 0.85
# llama.cpp: CUDA context plus compute buffers for one micro-batch (-ub 512).
LLAMACPP_UBATCH = 512


def weight_bytes_total(spec: ModelSpec, quant: Quantization, repacked: bool = False) -> int:
    """All weights a server loads for this quantization (DeepSeek's MTP layer is not loaded by default).

    repacked: vLLM without FP4 tensor cores repacks the format (quant.repacked_bits, e.g. MXFP4)."""
    bits_quantized = quant.repacked_bits if repacked and quant.repacked_bits else quant.bits
    if spec.weights_exact and quant.name == spec.checkpoint_dtype and bits_quantized == quant.bits:
        return spec.weights_bytes
    total = 0.0
    for kind, params in spec.params_by_kind.items():
        if kind == "mtp":
            continue
        bits = bits_quantized if kind in quant.quantized else 16
        total += params * bits / 8
    return int(total)


# vLLM runs MXFP4 experts without FP4 tensor cores through the Marlin MoE kernel, which needs n % 256 and
# k % 128 of each expert GEMM: create_weights pads intermediate_size_per_partition up to a multiple of 128
# and hidden_size to 256 (vllm/model_executor/layers/quantization/mxfp4.py, Mxfp4Backend.MARLIN). Each
# expert keeps 4-bit weights with an e8m0 scale per 32 (4.25 bits) and bf16 biases. gpt-oss-120b: 65.9 GiB
# at TP=1 (65.97 logged on an H100, vllm#23278), gpt-oss-20b 13.66 GiB (13.72 on an A100).
MARLIN_MXFP4_INTERMEDIATE_ALIGN, MARLIN_MXFP4_HIDDEN_ALIGN = 128, 256
MXFP4_BITS = 4.25


def _round_up(value: int, align: int) -> int:
    return -(-value // align) * align


def marlin_mxfp4_expert_bytes(spec: ModelSpec, tp: int) -> int:
    """One GPU's MXFP4 experts once vLLM pads them for Marlin (every expert on every rank, 1/TP of each)."""
    inter = _round_up(math.ceil(spec.moe_intermediate_size / tp), MARLIN_MXFP4_INTERMEDIATE_ALIGN)
    hidden = _round_up(spec.hidden_size, MARLIN_MXFP4_HIDDEN_ALIGN)
    per_expert = 3 * inter * hidden * MXFP4_BITS / 8 + (2 * inter + hidden) * 2
    return int(spec.num_hidden_layers * spec.num_experts * per_expert)


def weight_bytes_per_gpu(
    spec: ModelSpec, quant: Quantization, tp: int, pp: int, repacked: bool = False
) -> int:
    """TP shards every matrix (embeddings are vocab-parallel); pipeline parallel splits the layers. MXFP4
    experts that vLLM repacks for Marlin are counted with its padding (marlin_mxfp4_expert_bytes)."""
    if repacked and quant.name == "mxfp4" and spec.num_experts and "experts" in quant.quantized:
        experts = spec.params_by_kind.get("experts", 0)
        rest = weight_bytes_total(spec, quant) - experts * quant.bits / 8
        return math.ceil(rest / (tp * pp) + marlin_mxfp4_expert_bytes(spec, tp) / pp)
    return math.ceil(weight_bytes_total(spec, quant, repacked) / (tp * pp))


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


def pp_stage_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage as vLLM splits them (vllm/distributed/utils.py get_pp_indices): an even
    share each, the remainder one by one to the stages before the last (27 layers, PP=2: [14, 13])."""
    stages = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        stages[-i] += 1
    return stages


def kv_bytes_per_token(spec: ModelSpec, kv_bytes: float, tp: int, pp: int) -> float:
    """KV bytes one token costs on one GPU while the context is shorter than every window."""
    full, sliding = layers_per_gpu(spec, pp)
    return (full + sliding) * kv_bytes_per_token_layer(spec, kv_bytes, tp)


def layer_windows(spec: ModelSpec) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: full attention), as every engine's term reads spec.layer_types."""
    if not spec.layer_types:
        return (None,) * spec.num_hidden_layers
    return tuple(spec.sliding_window if t == "sliding_attention" else None for t in spec.layer_types)


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


def forward_activation_bytes(spec: ModelSpec, tokens: int, tp: int, act_bytes: int = 2) -> int:
    """Peak activation of one forward pass over `tokens` tokens (an engine's profile run).

    Dense MLP: the gate/up output (2I) and the activated product (I), sharded by TP, plus two hidden-size
    buffers and the attention's q/k/v output (heads + 2 x KV heads) x head_dim / TP, which the eager
    profile still holds. MoE: the fused-MoE caches hold top_k copies of the MLP part. Checked against V0's
    logged peaks where the forward pass dominates (fit split of tests/data/vllm_logs.yaml): 2.14 vs 2.07
    GiB (Llama-3.1-8B, 20000 tokens), 3.10 vs 2.99 (29000 tokens), 4.19 vs 4.35 (Qwen2.5-7B, 32768); the
    MLP part alone gave 1.91, 2.77 and 3.91."""
    hidden = spec.hidden_size
    qkv = (spec.num_attention_heads + 2 * spec.num_key_value_heads) * spec.head_dim / tp
    if spec.num_experts:
        k = spec.num_experts_per_tok
        per_token = 3 * spec.moe_intermediate_size * k / tp + k * hidden + 2 * hidden + qkv
    else:
        per_token = 3 * spec.intermediate_size / tp + 2 * hidden + qkv
    return int(tokens * per_token * act_bytes)


def sampler_bytes(spec: ModelSpec, num_reqs: int, bytes_per_logit: float = SAMPLER_BYTES_PER_LOGIT) -> int:
    """The profile run's sampler over num_reqs requests; logits are gathered whole on every TP rank."""
    return int(num_reqs * spec.vocab_size * bytes_per_logit)


def vllm_profile_peak(
    spec: ModelSpec,
    tokens: int,
    num_reqs: int,
    tp: int,
    bytes_per_logit: float = SAMPLER_BYTES_PER_LOGIT,
) -> int:
    """vLLM's "PyTorch activation peak": the forward pass and the sampler run one after the other, so the
    peak is the larger of the two (num_reqs=0: no sampler, as on a pipeline stage before the last).
    bytes_per_logit depends on the vLLM version (vllm_versions.VllmFamily.sampler_bytes_per_logit)."""
    return max(forward_activation_bytes(spec, tokens, tp), sampler_bytes(spec, num_reqs, bytes_per_logit))


def activation_bytes(spec: ModelSpec, tokens: int, tp: int, max_num_seqs: int) -> int:
    """Engines other than vLLM: a forward pass plus fp32 sampler logits for max_num_seqs sequences."""
    logits = sampler_bytes(spec, max_num_seqs, LOGIT_BYTES_OTHER)
    return forward_activation_bytes(spec, tokens, tp) + logits


def cuda_graph_bytes(spec: ModelSpec, pp: int) -> int:
    return CUDA_GRAPH_BASE_BYTES + CUDA_GRAPH_PER_LAYER_BYTES * math.ceil(spec.num_hidden_layers / pp)


def non_torch_bytes(num_gpus_per_replica: int) -> int:
    return NON_TORCH_MULTI_GPU_BYTES if num_gpus_per_replica > 1 else NON_TORCH_BYTES


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
