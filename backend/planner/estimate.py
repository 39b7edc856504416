"""estimate(PlanRequest) -> Estimate: memory per GPU, fit, KV capacity, concurrency, speed and cost."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from backend.planner import memory, speed
from backend.planner.catalog import GIB, GPU, Quantization, get_gpu, get_kv_cache_dtype
from backend.planner.request import PlanRequest
from backend.planner.sources import load_model_spec
from backend.planner.specs import ModelSpec
from backend.planner.validation import resolve_quant, validate_request

BUDGET_ENGINES = ("vllm", "sglang", "trtllm", "tgi", "mii")  # engines that size KV from a memory budget
CONTEXT_ENGINES = ("llamacpp", "ollama")  # engines that allocate exactly the context they are given
LLAMA_UBATCH_LOGITS = memory.LLAMACPP_UBATCH * 4  # llama.cpp computes fp32 logits for a whole micro-batch


@dataclass(slots=True)
class Estimate:
    model: str
    gpu: str
    engine: str
    quant: str
    kv_cache_dtype: str
    num_gpus: int
    tp: int
    pp: int
    replicas: int
    max_model_len: int
    input_len: int
    output_len: int
    concurrency: int
    gpu_memory_utilization: float
    params_total: int
    params_active: int
    gpu_memory_bytes: int  # usable memory of one GPU
    weights_bytes: int  # all byte figures are per GPU
    kv_bytes_per_token: float
    kv_bytes_per_sequence: int  # one sequence of input_len + output_len tokens
    kv_cache_bytes: int
    kv_cache_tokens: int
    activation_bytes: int
    overhead_bytes: int
    cuda_graph_bytes: int
    total_bytes_per_gpu: int
    fits: bool
    fit_reason: str
    max_concurrency: int
    max_model_len_single: int
    batch_size: int  # sequences decoding together in the speed figures: min(concurrency, max_concurrency)
    prefill_tokens_per_s: float
    ttft_s: float | None
    decode_tokens_per_s_per_seq: float
    decode_tokens_per_s_total: float
    tpot_s: float | None
    price_per_hour: float  # all GPUs of the plan
    cost_per_million_output_tokens: float | None
    cost_per_million_input_tokens: float | None
    warnings: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _embedded_dtype_bytes(quant: Quantization) -> int:
    """The embedded engine loads every format (GGUF included) dequantized to its compute dtype."""
    return 4 if quant.name == "fp32" else 2


def estimate(req: PlanRequest) -> Estimate:
    """The estimate for one plan; when it does not fit, est.fixes lists concrete changes that would."""
    from backend.planner.advise import suggest_fixes  # advise builds on this module

    spec = load_model_spec(req.model, req.revision)

    est = estimate_for_spec(req, spec)
    if not est.fits:
        est.fixes = suggest_fixes(req, spec, est)
    return est


def estimate_for_spec(req: PlanRequest, spec: ModelSpec) -> Estimate:
    tp, max_len = validate_request(req, spec)
    gpu: GPU = get_gpu(req.gpu)
    quant = resolve_quant(req.quant, spec)
    kv_dtype = get_kv_cache_dtype(req.kv_cache_dtype)
    engine, pp, bs = req.engine, req.pp, req.block_size
    on_cpu = gpu.name == "CPU"
    warnings: list[str] = []
    per_replica = tp * pp
    replicas = req.num_gpus // per_replica

    if engine == "embedded":
        dtype_bytes = _embedded_dtype_bytes(quant)
        weights = (
            math.ceil(spec.params_total - spec.params_by_kind.get("mtp", 0)) * dtype_bytes // per_replica
        )
        if on_cpu and spec.tie_word_embeddings:  # its oneDNN-packed copy of the embedding for the lm_head
            weights += spec.vocab_size * spec.hidden_size * dtype_bytes
        kv_bytes = dtype_bytes if req.kv_cache_dtype == "auto" else kv_dtype.bytes
        if quant.bits < 16:
            warnings.append(f"the embedded engine dequantizes {quant.name} weights to 16-bit at load time")
    else:
        weights = memory.weight_bytes_per_gpu(spec, quant, tp, pp)
        kv_bytes = 4 if (req.kv_cache_dtype == "auto" and quant.name == "fp32") else kv_dtype.bytes
    per_token = memory.kv_bytes_per_token(spec, kv_bytes, tp, pp)
    seq_bytes = memory.kv_bytes_per_sequence(spec, req.input_len + req.output_len, kv_bytes, tp, pp, bs)
    max_seq_bytes = memory.kv_bytes_per_sequence(spec, max_len, kv_bytes, tp, pp, bs)

    activation = memory.activation_bytes(spec, min(req.max_num_batched_tokens, max_len), tp, req.max_num_seqs)
    overhead = memory.non_torch_bytes(per_replica)
    graphs = memory.cuda_graph_bytes(spec, pp) if engine in ("vllm", "sglang", "trtllm") and not on_cpu else 0
    if engine == "embedded":
        activation = memory.activation_bytes(spec, min(req.max_num_batched_tokens, 512), tp, req.max_num_seqs)
        kv_cache = memory.kv_budget_bytes(
            engine, gpu.usable_bytes, 1.0, weights, activation, overhead, on_cpu
        )
        per_block = per_token * bs  # the engine keeps every layer's full context (no window savings)
        num_blocks = min(req.max_num_seqs * math.ceil(max_len / bs), kv_cache // per_block)
        kv_cache = num_blocks * per_block
        seq_bytes = math.ceil((req.input_len + req.output_len) / bs) * per_block
        max_seq_bytes = math.ceil(max_len / bs) * per_block
        if req.max_model_len is None and num_blocks * bs < max_len:
            max_len, max_seq_bytes = num_blocks * bs, num_blocks * per_block
    elif engine in CONTEXT_ENGINES:
        activation = LLAMA_UBATCH_LOGITS * spec.vocab_size + memory.activation_bytes(spec, 512, tp, 0)
        kv_cache = max_seq_bytes * req.concurrency  # -c max_model_len * -np concurrency
    else:
        budget = memory.kv_budget_bytes(
            engine, gpu.usable_bytes, req.gpu_memory_utilization, weights, activation, overhead, on_cpu
        )
        per_block = per_token * bs
        kv_cache = max(int(budget // per_block * per_block), 0)
    total = weights + kv_cache + activation + overhead + graphs

    fits, reason = _fit(
        engine, gpu, req, weights, activation, overhead, kv_cache, max_seq_bytes, total, max_len
    )
    max_conc = int(kv_cache // seq_bytes) if seq_bytes else 0
    if engine not in CONTEXT_ENGINES:
        max_conc = min(max_conc, req.max_num_seqs)
    if spec.num_sliding_layers and engine != "embedded":
        kv_tokens = (
            int(kv_cache // max_seq_bytes * max_len) if max_seq_bytes else 0
        )  # vLLM: concurrency x len
    else:
        kv_tokens = int(kv_cache // (per_token * bs) * bs) if per_token else 0
    single = _longest_sequence(spec, kv_cache, kv_bytes, tp, pp, bs, engine, per_token)

    batch = max(min(req.concurrency, max_conc), 1)
    avg_context = req.input_len + req.output_len // 2
    ctx_bytes = memory.kv_bytes_per_sequence(spec, avg_context, kv_bytes, tp, pp, bs)
    weights_total = weights * per_replica
    step = speed.decode_step_seconds(
        spec, quant, gpu, speed.Parallel(tp, pp), weights_total, batch, ctx_bytes, avg_context
    )
    prefill = speed.prefill_seconds(spec, quant, gpu, speed.Parallel(tp, pp), weights_total, req.input_len)
    if engine == "embedded" and on_cpu:  # a Python engine on a CPU: fixed dispatch cost per layer and step
        step += spec.num_hidden_layers * speed.EMBEDDED_CPU_LAYER_OVERHEAD_S
        prefill += spec.num_hidden_layers * speed.EMBEDDED_CPU_LAYER_OVERHEAD_S
    decode_total = batch / step * replicas
    prefill_tps = req.input_len / prefill * replicas
    price = gpu.price_per_hour * req.num_gpus

    if engine not in quant.engines:
        warnings.append(
            f"{engine} does not load {quant.name} weights; engines that do: {', '.join(quant.engines)}"
        )
    if engine not in kv_dtype.engines:
        warnings.append(
            f"{engine} has no {kv_dtype.name} KV cache; engines that do: {', '.join(kv_dtype.engines)}"
        )
    stored = spec.checkpoint_dtype
    if engine != "embedded" and quant.name != stored and stored != "bf16" and req.quant != "auto":
        warnings.append(
            f"the checkpoint is stored as {stored}; {quant.name} assumes a "
            f"checkpoint in that format (quant='auto' uses the stored one)"
        )
    if fits and req.concurrency > max_conc:
        warnings.append(
            f"concurrency {req.concurrency} exceeds the {max_conc} sequences of "
            f"{req.input_len + req.output_len} tokens that fit; the rest wait in the queue"
        )
    headroom = gpu.usable_bytes * (1 - req.gpu_memory_utilization)
    if engine == "vllm" and graphs > headroom:
        warnings.append(
            f"CUDA graphs (~{graphs / GIB:.2f} GiB) exceed the {headroom / GIB:.2f} GiB outside "
            "gpu_memory_utilization; lower it or pass --enforce-eager"
        )
    if on_cpu and engine not in ("embedded", "llamacpp", "ollama"):
        warnings.append(f"{engine} needs a GPU; on a CPU-only host use engine 'embedded' or 'llamacpp'")
    if pp > 1:
        warnings.append("pipeline parallel: decode speed assumes no micro-batch overlap (a lower bound)")

    return Estimate(
        model=spec.name,
        gpu=gpu.name,
        engine=engine,
        quant=quant.name,
        kv_cache_dtype=kv_dtype.name,
        num_gpus=req.num_gpus,
        tp=tp,
        pp=pp,
        replicas=replicas,
        max_model_len=max_len,
        input_len=req.input_len,
        output_len=req.output_len,
        concurrency=req.concurrency,
        gpu_memory_utilization=req.gpu_memory_utilization,
        params_total=spec.params_total,
        params_active=spec.params_active,
        gpu_memory_bytes=gpu.usable_bytes,
        weights_bytes=weights,
        kv_bytes_per_token=per_token,
        kv_bytes_per_sequence=seq_bytes,
        kv_cache_bytes=kv_cache,
        kv_cache_tokens=kv_tokens,
        activation_bytes=activation,
        overhead_bytes=overhead,
        cuda_graph_bytes=graphs,
        total_bytes_per_gpu=total,
        fits=fits,
        fit_reason=reason,
        max_concurrency=max_conc if fits else 0,
        max_model_len_single=single,
        batch_size=batch,
        prefill_tokens_per_s=prefill_tps,
        ttft_s=prefill if fits else None,
        decode_tokens_per_s_per_seq=1 / step,
        decode_tokens_per_s_total=decode_total,
        tpot_s=step if fits else None,
        price_per_hour=price,
        cost_per_million_output_tokens=speed.cost_per_million(gpu.price_per_hour, req.num_gpus, decode_total),
        cost_per_million_input_tokens=speed.cost_per_million(gpu.price_per_hour, req.num_gpus, prefill_tps),
        warnings=warnings,
    )


def _fit(
    engine, gpu, req, weights, activation, overhead, kv_cache, max_seq_bytes, total, max_len
) -> tuple[bool, str]:
    gib = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
    if engine in CONTEXT_ENGINES or engine == "embedded":
        if total > gpu.usable_bytes:
            return False, f"needs {gib(total)} per GPU but {gpu.name} has {gib(gpu.usable_bytes)}"
        if kv_cache < max_seq_bytes:
            return False, f"the KV pool ({gib(kv_cache)}) cannot hold one {max_len}-token sequence"
        return True, f"{gib(total)} of {gib(gpu.usable_bytes)} per GPU"
    budget = int(gpu.usable_bytes * req.gpu_memory_utilization)
    if weights + activation + overhead > budget:
        return False, (
            f"weights {gib(weights)} + activations {gib(activation)} + overhead {gib(overhead)} exceed "
            f"the {gib(budget)} budget (gpu_memory_utilization {req.gpu_memory_utilization} of "
            f"{gib(gpu.usable_bytes)})"
        )
    if kv_cache < max_seq_bytes:
        return False, (
            f"the KV cache ({gib(kv_cache)}) cannot hold one max_model_len={max_len} sequence "
            f"({gib(max_seq_bytes)}); vLLM refuses to start"
        )
    return True, f"weights {gib(weights)}, KV cache {gib(kv_cache)} within the {gib(budget)} budget"


def _longest_sequence(spec, kv_cache, kv_bytes, tp, pp, bs, engine, per_token) -> int:
    """Longest single sequence the KV cache holds, capped at the model's limit."""
    limit = spec.max_position_embeddings
    if engine == "embedded" or not spec.num_sliding_layers:
        return min(int(kv_cache // (per_token * bs) * bs) if per_token else 0, limit)
    lo, hi = 0, limit // bs  # blocks: bisect, since sliding layers cost at most a window each
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if memory.kv_bytes_per_sequence(spec, mid * bs, kv_bytes, tp, pp, bs) <= kv_cache:
            lo = mid
        else:
            hi = mid - 1
    return min(lo * bs, limit)
