"""The memory phase of an estimate: what one GPU holds under one engine's accounting, and whether it starts.

Budget engines (vLLM, TGI, MII, TensorRT-LLM, SGLang) size the KV cache from what is left; context engines
(llama.cpp, Ollama) allocate the context they are given; the embedded engine follows backend/engine/device.py.
vLLM's accounting depends on its version (vllm_rules.py): the profiled activation peak, the non-torch
memory and, from 0.21, the CUDA-graph estimate come out of gpu_memory_utilization x total memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from backend.engine.decode_graph_memory import DecodeGraphShape, decode_graph_bytes
from backend.engine.models.registry import traits_of
from backend.engine.sliding_window import blocks_per_sequence, freeable_window, kv_cache_bytes
from backend.engines import CONTEXT_ENGINES, ENGINE_TRAITS, GRAPH_ENGINES
from backend.planner import memory
from backend.planner.catalog import GIB, GPU, KVCacheDtype, Quantization
from backend.planner.request import PlanRequest
from backend.planner.specs import ModelSpec
from backend.planner.vllm_rules import SchedulerLimits, non_torch_bytes

# Checkpoints the embedded engine keeps as stored: GGUF block types (backend/engine/quantization/
# gguf_blocks.py) and GPTQ / AWQ / compressed-tensors pack-quantized (gptq_awq.py)
EMBEDDED_AS_STORED: tuple[str, ...] = ("gguf-q4_0", "gguf-q4_1", "gguf-q8_0", "gguf-q4_k_s", "gguf-q4_k_m")
EMBEDDED_AS_STORED += ("gguf-q6_k", "gptq-int4-g128", "gptq-int4-g32", "gptq-int8-g128", "awq-int4")
LLAMA_UBATCH_LOGITS = memory.LLAMACPP_UBATCH * 4  # llama.cpp computes fp32 logits for a whole micro-batch
# GGUF types the engine interleaves with fast bf16 (cpu_kernels.INTERLEAVED_TYPES); the others, and every
# type without fast bf16, stay row by row on quant_gemv, whose captured calls take up to 8 rows
# (cpu_kernels.QUANT_GEMV_MAX_ROWS, graph_ops.row_limit): a larger decode step runs eagerly
GGUF_INTERLEAVED = ("gguf-q4_0", "gguf-q4_1", "gguf-q8_0")
GGUF_ROWS_CAPTURED = 8
# ... except Q6_K, whose captured calls are quant_gemm_q6_k's (cpu_kernels.Q6_K_GEMM_MAX_ROWS)
GGUF_ROWS_CAPTURED_BY_QUANT = {"gguf-q6_k": 64}


@dataclass(slots=True, frozen=True)
class Layout:
    """The fixed inputs of the memory phase: what runs where."""

    gpu: GPU
    quant: Quantization
    kv_dtype: KVCacheDtype
    tp: int
    max_model_len: int
    limits: SchedulerLimits


@dataclass(slots=True)
class MemoryPlan:
    """Bytes per GPU, and the verdict the engine itself would give at startup."""

    weights: int
    kv_element_bytes: float
    kv_bytes_per_token: float
    kv_bytes_per_sequence: int  # one input_len + output_len sequence
    max_sequence_bytes: int  # one max_model_len sequence
    activation: int
    overhead: int
    cuda_graphs: int
    kv_cache: int
    max_model_len: int
    fits: bool = False
    fit_reason: str = ""

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activation + self.overhead + self.cuda_graphs


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB"


def runs_as_stored(spec: ModelSpec, lay: Layout) -> bool:
    """The embedded engine computes from the checkpoint's quantized blocks (the rest it dequantizes)."""
    return lay.quant.name == spec.checkpoint_dtype in EMBEDDED_AS_STORED


def captured_row_limit(spec: ModelSpec, lay: Layout) -> int | None:
    """The most rows a captured decode step takes (None: any): GGUF_ROWS_CAPTURED where the engine keeps
    a GGUF's blocks row by row."""
    gguf = runs_as_stored(spec, lay) and lay.quant.name.startswith("gguf-")
    fast_bf16 = lay.gpu.cpu is not None and lay.gpu.cpu.has_fast_bf16
    rows = gguf and not (fast_bf16 and lay.quant.name in GGUF_INTERLEAVED)
    return GGUF_ROWS_CAPTURED_BY_QUANT.get(lay.quant.name, GGUF_ROWS_CAPTURED) if rows else None


def _weights(req: PlanRequest, spec: ModelSpec, lay: Layout) -> tuple[int, float]:
    """(weight bytes per GPU, bytes per KV element) as the engine loads them."""
    per_replica = lay.tp * req.pp
    if req.engine == "embedded":  # GGUF of a kept type runs as stored; the rest is dequantized at load
        dtype_bytes = 4 if lay.quant.name == "fp32" else 2
        kv_bytes = dtype_bytes if req.kv_cache_dtype == "auto" else lay.kv_dtype.bytes
        as_stored = runs_as_stored(spec, lay)
        if as_stored:
            weights = spec.weights_bytes // per_replica
        else:
            weights = (
                math.ceil(spec.params_total - spec.params_by_kind.get("mtp", 0)) * dtype_bytes // per_replica
            )
        dense_embedding = not (as_stored and spec.checkpoint_dtype.startswith("gguf"))
        # a 16-bit model on a CPU without bf16 units: Linear.prepare packs an fp32 copy beside each dense
        # projection's weight (engine/layers/linear.py), the lm_head's too
        cpu = lay.gpu.cpu
        fp32_copies = lay.gpu.is_cpu and dtype_bytes == 2 and cpu is not None and not cpu.has_fast_bf16
        head = spec.vocab_size * spec.hidden_size
        if lay.gpu.is_cpu and spec.tie_word_embeddings and dense_embedding:  # its packed lm_head copy
            weights += head * (4 if fp32_copies else dtype_bytes)
        elif fp32_copies and dense_embedding:
            weights += head * 4
        if fp32_copies and not as_stored:
            projections = spec.params_by_kind.get("attention", 0) + spec.params_by_kind.get("mlp", 0)
            weights += projections * 4 // per_replica
        return weights, kv_bytes
    repacked = req.engine == "vllm" and not lay.gpu.fp4_native
    weights = memory.weight_bytes_per_gpu(spec, lay.quant, lay.tp, req.pp, repacked)
    fp32 = req.kv_cache_dtype == "auto" and lay.quant.name == "fp32"
    return weights, (4 if fp32 else lay.kv_dtype.bytes)


def _base_plan(req: PlanRequest, spec: ModelSpec, lay: Layout) -> MemoryPlan:
    weights, kv_bytes = _weights(req, spec, lay)
    tp, pp, bs, max_len = lay.tp, req.pp, req.block_size, lay.max_model_len
    on_gpu = not lay.gpu.is_cpu
    return MemoryPlan(
        weights=weights,
        kv_element_bytes=kv_bytes,
        kv_bytes_per_token=memory.kv_bytes_per_token(spec, kv_bytes, tp, pp),
        kv_bytes_per_sequence=memory.kv_bytes_per_sequence(
            spec, req.input_len + req.output_len, kv_bytes, tp, pp, bs
        ),
        max_sequence_bytes=memory.kv_bytes_per_sequence(spec, max_len, kv_bytes, tp, pp, bs),
        activation=0,
        overhead=(
            non_torch_bytes(lay.limits.family, lay.gpu, tp, pp, req.disable_custom_all_reduce)
            if req.engine == "vllm"
            else memory.non_torch_bytes(tp * pp)
        ),
        cuda_graphs=(
            memory.cuda_graph_bytes(spec, pp)
            if req.engine in GRAPH_ENGINES and on_gpu and not req.enforce_eager
            else 0
        ),
        kv_cache=0,
        max_model_len=max_len,
    )


@dataclass(slots=True, frozen=True)
class ProfileParts:
    """What vLLM's profile run holds at its peak, per GPU: the forward pass over max_num_batched_tokens,
    the dummy sampler over num_reqs rows, and the sampler state Model Runner V2 keeps all along."""

    num_reqs: int
    forward: int
    sampler: int
    sampler_state: int

    @property
    def peak(self) -> int:
        """The forward pass and the sampler run one after the other; the state sits under both."""
        return self.sampler_state + max(self.forward, self.sampler)


def vllm_profile_parts(spec: ModelSpec, lay: Layout) -> ProfileParts:
    """profile_run's parts (vllm/v1/worker/gpu_model_runner.py, Model Runner V2's gpu/model_runner.py).
    V0 (vllm/worker/model_runner.py profile_run, 0.6-0.10) samples max_num_seqs dummy prompts with top_k =
    vocab - 1 whether or not chunked prefill is on, on the driver worker only (`if not
    self.is_driver_worker: return []`), and the engine keeps the smallest block count of all ranks."""
    limits = lay.limits
    tokens = limits.max_num_batched_tokens
    num_reqs = min(limits.max_num_seqs, tokens)
    sampled_rows = math.ceil(num_reqs / lay.tp) if limits.sampler_shards else num_reqs
    return ProfileParts(
        num_reqs,
        memory.forward_activation_bytes(spec, tokens, lay.tp),
        memory.sampler_bytes(spec, sampled_rows, limits.sampler_bytes_per_logit),
        memory.sampler_bytes(spec, limits.max_num_seqs, limits.sampler_state_bytes_per_logit),
    )


def _vllm(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan) -> None:
    """vllm/v1/worker/gpu_worker.py determine_available_memory (V0: worker/worker.py
    determine_num_available_blocks): total x gpu_memory_utilization - weights - activation peak -
    non-torch memory (- the CUDA-graph estimate from 0.21 on Model Runner V1), floored to whole blocks."""
    limits = lay.limits
    plan.activation = vllm_profile_parts(spec, lay).peak
    budget = int(lay.gpu.usable_bytes * req.gpu_memory_utilization) - plan.weights
    budget -= plan.overhead + (plan.cuda_graphs if limits.subtracts_cuda_graphs else 0)
    per_block = plan.kv_bytes_per_token * req.block_size
    if req.pp > 1:
        blocks = _pp_blocks(req, spec, lay, plan, budget)
    else:
        blocks = int((budget - plan.activation) // per_block)
    plan.kv_cache = max(int(blocks * per_block), 0)


def _pp_blocks(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan, budget: int) -> int:
    """KV blocks with pipeline parallelism. Only the last stage runs the sampler in the profile run (vLLM
    gpu_model_runner.py profile_run: `if get_pp_group().is_last_rank`), and every rank then keeps the
    smallest block count (kv_cache_utils.py get_kv_cache_configs). The last stage holds the even share of
    layers, the stages before it one more where the count does not divide (memory.pp_stage_layers), so the
    earlier stages pay more per block but profile the forward pass only; plan.kv_bytes_per_token is the
    largest stage's. Weights are split evenly (embeddings sit on the first stage, lm_head on the last)."""
    stages = memory.pp_stage_layers(spec.num_hidden_layers, req.pp)
    forward = memory.forward_activation_bytes(spec, lay.limits.max_num_batched_tokens, lay.tp)
    per_block = plan.kv_bytes_per_token * req.block_size
    earlier = (budget - forward) // per_block
    last = (budget - plan.activation) // (per_block * stages[-1] / max(stages))
    return int(min(earlier, last))


def _other_budget(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan) -> None:
    tokens = min(lay.limits.max_num_batched_tokens, lay.max_model_len)
    plan.activation = memory.activation_bytes(spec, tokens, lay.tp, lay.limits.max_num_seqs)
    budget = memory.kv_budget_bytes(
        req.engine,
        lay.gpu.usable_bytes,
        req.gpu_memory_utilization,
        plan.weights,
        plan.activation,
        plan.overhead,
        False,
    )
    per_block = plan.kv_bytes_per_token * req.block_size
    plan.kv_cache = max(int(budget // per_block * per_block), 0)


def _decode_graph_shape(req: PlanRequest, spec: ModelSpec, lay: Layout) -> DecodeGraphShape | None:
    """The captured decode step's widths (None: not captured), as the engine captures where its native
    kernels serve every projection (backend/engine/decode_graph.py, graph_ops.unsupported_linear), unless
    enforce_eager: on a CPU with fast bf16 (AVX-512 BF16 or AMX) in bf16 (weights dequantized to bf16 or
    run as stored); on one without, a GGUF run as stored, in fp32 (the engine's dtype there; its blocks
    row by row on quant_gemv). A running engine's plan says enforce_eager when it did not capture
    (launch_here.running_engine_request)."""
    traits = traits_of(spec.architecture, spec.model_type)  # the engine's registry (None: it cannot run it)
    uncaptured = lay.quant.name in ("fp32", "fp16") or traits is None
    uncaptured = uncaptured or (traits is not None and not traits.captured_decode)  # its layers' kind
    if lay.gpu.cpu is None or req.enforce_eager or uncaptured:
        return None
    fast_bf16 = lay.gpu.cpu.has_fast_bf16
    if not fast_bf16 and not (runs_as_stored(spec, lay) and lay.quant.name.startswith("gguf-")):
        return None
    return DecodeGraphShape(
        spec.hidden_size,
        spec.intermediate_size,
        spec.num_attention_heads,
        spec.num_key_value_heads,
        spec.head_dim,
        spec.vocab_size,
        2 if fast_bf16 else 4,  # the engine's compute dtype there: bf16, or fp32
    )


def _embedded(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan) -> None:
    """The embedded engine keeps every block of a sequence, except where every layer is windowed: then only
    the window's and one step's chunk's (backend/engine/sliding_window.py; a hybrid model's full layers
    need all of them, and its one block table serves every layer). The pool holds max_num_seqs such
    sequences within its default budget, which gives up the captured decode step's buffers first
    (backend/engine/kv_cache_utils.py), as vLLM's profiler takes its CUDA graphs' memory off the KV cache."""
    tokens = min(lay.limits.max_num_batched_tokens, 512)
    max_num_seqs = lay.limits.max_num_seqs
    plan.activation = memory.activation_bytes(spec, tokens, lay.tp, max_num_seqs)
    on_cpu = lay.gpu.is_cpu
    budget = memory.kv_budget_bytes(
        "embedded", lay.gpu.usable_bytes, 1.0, plan.weights, plan.activation, plan.overhead, on_cpu
    )
    bs, max_len = req.block_size, lay.max_model_len
    graph = _decode_graph_shape(req, spec, lay)
    budget -= decode_graph_bytes(graph, max_num_seqs, max_len, bs) if graph else 0
    per_block = plan.kv_bytes_per_token * bs
    windows = memory.layer_windows(spec)
    longest = blocks_per_sequence(windows, bs, max_len, lay.limits.max_num_batched_tokens)
    num_blocks = min(max_num_seqs * longest, int(budget // per_block))
    plan.kv_cache = int(num_blocks * per_block)
    layer_bytes = memory.kv_bytes_per_token_layer(spec, plan.kv_element_bytes, lay.tp)
    seq_len = req.input_len + req.output_len
    plan.kv_bytes_per_sequence = kv_cache_bytes(windows, int(layer_bytes), seq_len, bs).engine_per_sequence
    plan.max_sequence_bytes = int(longest * per_block)
    if req.max_model_len is None and num_blocks < longest:
        plan.max_model_len, plan.max_sequence_bytes = num_blocks * bs, int(num_blocks * per_block)
    plan.cuda_graphs = decode_graph_bytes(graph, max_num_seqs, plan.max_model_len, bs) if graph else 0


def _context_engine(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan) -> None:
    """llama.cpp / Ollama: -c max_model_len x -np concurrency, compute buffers for one micro-batch."""
    plan.activation = LLAMA_UBATCH_LOGITS * spec.vocab_size + memory.activation_bytes(spec, 512, lay.tp, 0)
    plan.kv_cache = plan.max_sequence_bytes * req.concurrency


def _fit(req: PlanRequest, lay: Layout, plan: MemoryPlan) -> tuple[bool, str]:
    usable, max_len = lay.gpu.usable_bytes, plan.max_model_len
    if ENGINE_TRAITS[req.engine].kv_sizing != "budget":  # no share of memory to fill: it must fit
        if plan.total > usable:
            return False, f"needs {_gib(plan.total)} per GPU but {lay.gpu.name} has {_gib(usable)}"
        if plan.kv_cache < plan.max_sequence_bytes:
            return False, f"the KV pool ({_gib(plan.kv_cache)}) cannot hold one {max_len}-token sequence"
        return True, f"{_gib(plan.total)} of {_gib(usable)} per GPU"
    budget = int(usable * req.gpu_memory_utilization)
    graphs = plan.cuda_graphs if req.engine == "vllm" and lay.limits.subtracts_cuda_graphs else 0
    fixed = plan.weights + plan.activation + plan.overhead + graphs
    if fixed > budget:
        graph_text = f" + CUDA graphs {_gib(graphs)}" if graphs else ""
        return False, (
            f"weights {_gib(plan.weights)} + activations {_gib(plan.activation)} + overhead "
            f"{_gib(plan.overhead)}{graph_text} exceed the {_gib(budget)} budget (gpu_memory_utilization "
            f"{req.gpu_memory_utilization} of {_gib(usable)})"
        )
    if plan.kv_cache < plan.max_sequence_bytes:
        return False, (
            f"the KV cache ({_gib(plan.kv_cache)}) cannot hold one max_model_len={max_len} sequence "
            f"({_gib(plan.max_sequence_bytes)}); vLLM refuses to start"
        )
    return (
        True,
        f"weights {_gib(plan.weights)}, KV cache {_gib(plan.kv_cache)} within the {_gib(budget)} budget",
    )


def plan_memory(req: PlanRequest, spec: ModelSpec, lay: Layout) -> MemoryPlan:
    """Weights, KV cache, activations, overhead and CUDA graphs per GPU, and the startup verdict."""
    plan = _base_plan(req, spec, lay)
    if req.engine == "vllm":
        _vllm(req, spec, lay, plan)
    elif req.engine == "embedded":
        _embedded(req, spec, lay, plan)
    elif req.engine in CONTEXT_ENGINES:
        _context_engine(req, spec, lay, plan)
    else:
        _other_budget(req, spec, lay, plan)
    plan.fits, plan.fit_reason = _fit(req, lay, plan)
    return plan


def longest_sequence(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan) -> int:
    """Longest single sequence the KV cache holds, capped at the model's limit."""
    limit, bs, per_token = spec.max_position_embeddings, req.block_size, plan.kv_bytes_per_token
    if req.engine == "embedded" and freeable_window(memory.layer_windows(spec)) is not None:
        return _embedded_longest(req, spec, lay, plan)
    if req.engine == "embedded" or not spec.num_sliding_layers:
        return min(int(plan.kv_cache // (per_token * bs) * bs) if per_token else 0, limit)
    lo, hi = 0, limit // bs  # blocks: bisect, since sliding layers cost at most a window each
    while lo < hi:
        mid = (lo + hi + 1) // 2
        need = memory.kv_bytes_per_sequence(spec, mid * bs, plan.kv_element_bytes, lay.tp, req.pp, bs)
        if need <= plan.kv_cache:
            lo = mid
        else:
            hi = mid - 1
    return min(lo * bs, limit)


def _embedded_longest(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan) -> int:
    """An all-windowed model on the embedded engine: a sequence of any length holds at most its window's
    and a chunk's blocks (sliding_window.blocks_per_sequence), so the pool's blocks bound it only below
    that."""
    limit, bs = spec.max_position_embeddings, req.block_size
    num_blocks = int(plan.kv_cache // (plan.kv_bytes_per_token * bs)) if plan.kv_bytes_per_token else 0
    windows, chunk = memory.layer_windows(spec), lay.limits.max_num_batched_tokens
    if num_blocks >= blocks_per_sequence(windows, bs, limit, chunk):
        return limit
    return min(num_blocks * bs, limit)
