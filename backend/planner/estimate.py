"""estimate_for_spec(PlanRequest, ModelSpec) -> Estimate, in three phases: the memory plan (memory_plan.py),
speed and cost (speed.py), then the warnings. Fixes for a plan that does not fit come from advise.py,
which also holds the public estimate(PlanRequest) that loads the model spec first."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from backend.engines import CPU_ENGINES
from backend.planner import cpu_speed, memory, speed
from backend.planner.catalog import GIB, get_gpu, get_kv_cache_dtype
from backend.planner.memory_plan import (
    CONTEXT_ENGINES,
    EMBEDDED_AS_STORED,
    Layout,
    MemoryPlan,
    captured_row_limit,
    longest_sequence,
    plan_memory,
    runs_as_stored,
)
from backend.planner.memory_terms import MemoryTerm, plan_terms
from backend.planner.request import PlanRequest, resolve_quant, validate_request
from backend.planner.specs import ModelSpec
from backend.planner.vllm_rules import resolve_limits


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
    vllm_version: str  # the vLLM whose accounting the figures follow (vllm engine only)
    vllm_family: str  # its version family (vllm_versions.FAMILIES), "" for other engines
    max_num_seqs: int  # as the engine runs it: the request's, or the engine's default
    max_num_batched_tokens: int
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
    max_concurrency: int  # 0 when the plan does not start
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
    memory_terms: list[MemoryTerm] = field(default_factory=list)  # each term beside how it is computed
    warnings: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    max_concurrency_after_fix: int | None = None  # when it does not fit: after fixes[0]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True, frozen=True)
class Capacity:
    kv_tokens: int
    max_concurrency: int
    longest_sequence: int


@dataclass(slots=True, frozen=True)
class Speed:
    batch: int
    step_s: float
    prefill_s: float
    decode_total: float
    prefill_tps: float


def _capacity(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan) -> Capacity:
    seq, max_seq = plan.kv_bytes_per_sequence, plan.max_sequence_bytes
    max_conc = int(plan.kv_cache // seq) if seq else 0
    if req.engine not in CONTEXT_ENGINES:
        max_conc = min(max_conc, lay.limits.max_num_seqs)
    if spec.num_sliding_layers and req.engine != "embedded":  # vLLM: concurrency at max_model_len x it
        kv_tokens = int(plan.kv_cache // max_seq * plan.max_model_len) if max_seq else 0
    else:
        per_block = plan.kv_bytes_per_token * req.block_size
        kv_tokens = int(plan.kv_cache // per_block * req.block_size) if per_block else 0
    return Capacity(kv_tokens, max_conc, longest_sequence(req, spec, lay, plan))


def _speed(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan, max_conc: int) -> Speed:
    """Decode and prefill times for the workload: the roofline (speed.py), or on a CPU host the embedded
    engine's own parts (cpu_speed.py)."""
    tp, pp = lay.tp, req.pp
    replicas = req.num_gpus // (tp * pp)
    batch = max(min(req.concurrency, max_conc), 1)
    avg_context = req.input_len + req.output_len // 2
    ctx_bytes = memory.kv_bytes_per_sequence(spec, avg_context, plan.kv_element_bytes, tp, pp, req.block_size)
    if req.engine == "embedded" and lay.gpu.cpu is not None:
        step, prefill = _cpu_times(req, spec, lay, plan, batch, ctx_bytes)
        return Speed(batch, step, prefill, batch / step * replicas, req.input_len / prefill * replicas)
    weights_total = plan.weights * tp * pp
    par = speed.Parallel(tp, pp)
    step = speed.decode_step_seconds(
        spec, lay.quant, lay.gpu, par, weights_total, batch, ctx_bytes, avg_context
    )
    prefill = speed.prefill_seconds(spec, lay.quant, lay.gpu, par, weights_total, req.input_len)
    return Speed(batch, step, prefill, batch / step * replicas, req.input_len / prefill * replicas)


def _cpu_times(
    req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan, batch: int, ctx_bytes: float
) -> tuple[float, float]:
    """(decode step, prefill) seconds of the embedded engine on a CPU host: weights as it holds them
    (quantized blocks as stored, else 16- or 32-bit), the captured decode step when the plan holds its
    buffers (memory_plan._decode_graph_shape)."""
    assert lay.gpu.cpu is not None
    matmul = speed.matmul_params(spec)
    as_stored = runs_as_stored(spec, lay)
    if as_stored:  # the checkpoint's bytes, less what the lookup-only input embedding holds
        read = spec.weights_bytes * matmul / max(spec.params_total, 1)
    else:
        read = matmul * (4 if lay.quant.name == "fp32" else 2)
    weights = cpu_speed.CPUWeights(read, matmul, spec.vocab_size * spec.hidden_size, as_stored)
    limit = captured_row_limit(spec, lay)
    captured = plan.cuda_graphs > 0 and (limit is None or batch <= limit)
    step = cpu_speed.decode_step_seconds(lay.gpu.cpu, spec, weights, batch, ctx_bytes, captured)
    chunk = lay.limits.max_num_batched_tokens
    return step, cpu_speed.prefill_seconds(lay.gpu.cpu, spec, weights, req.input_len, chunk)


def _format_warnings(req: PlanRequest, spec: ModelSpec, lay: Layout) -> list[str]:
    engine, quant, kv_dtype = req.engine, lay.quant, lay.kv_dtype
    warnings = []
    if engine == "embedded" and quant.bits < 16 and quant.name not in EMBEDDED_AS_STORED:
        warnings.append(f"the embedded engine dequantizes {quant.name} weights to 16-bit at load time")
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
    return warnings


def _warnings(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan, cap: Capacity) -> list[str]:
    warnings = _format_warnings(req, spec, lay)
    if plan.fits and req.concurrency > cap.max_concurrency:
        warnings.append(
            f"concurrency {req.concurrency} exceeds the {cap.max_concurrency} sequences of "
            f"{req.input_len + req.output_len} tokens that fit; the rest wait in the queue"
        )
    headroom = lay.gpu.usable_bytes * (1 - req.gpu_memory_utilization)
    if req.engine == "vllm" and not lay.limits.subtracts_cuda_graphs and plan.cuda_graphs > headroom:
        warnings.append(
            f"CUDA graphs (~{plan.cuda_graphs / GIB:.2f} GiB) exceed the {headroom / GIB:.2f} GiB outside "
            "gpu_memory_utilization; lower it or pass --enforce-eager"
        )
    if lay.gpu.is_cpu and req.engine not in CPU_ENGINES:
        warnings.append(f"{req.engine} needs a GPU; on a CPU-only host use engine 'embedded' or 'llamacpp'")
    if req.pp > 1:
        warnings.append("pipeline parallel: decode speed assumes no micro-batch overlap (a lower bound)")
    return warnings


def _layout(req: PlanRequest, spec: ModelSpec) -> Layout:
    tp, max_len = validate_request(req, spec)
    gpu = get_gpu(req.gpu)
    limits = resolve_limits(req, gpu, max_len, moe=bool(spec.num_experts))
    return Layout(
        gpu, resolve_quant(req.quant, spec), get_kv_cache_dtype(req.kv_cache_dtype), tp, max_len, limits
    )


def _request_fields(req: PlanRequest, spec: ModelSpec, lay: Layout, plan: MemoryPlan) -> dict:
    return dict(
        model=spec.name,
        gpu=lay.gpu.name,
        engine=req.engine,
        quant=lay.quant.name,
        kv_cache_dtype=lay.kv_dtype.name,
        num_gpus=req.num_gpus,
        tp=lay.tp,
        pp=req.pp,
        replicas=req.num_gpus // (lay.tp * req.pp),
        max_model_len=plan.max_model_len,
        input_len=req.input_len,
        output_len=req.output_len,
        concurrency=req.concurrency,
        gpu_memory_utilization=req.gpu_memory_utilization,
        vllm_version=".".join(map(str, lay.limits.version)) if req.engine == "vllm" else "",
        vllm_family=lay.limits.family.name if req.engine == "vllm" else "",
        max_num_seqs=lay.limits.max_num_seqs,
        max_num_batched_tokens=lay.limits.max_num_batched_tokens,
        params_total=spec.params_total,
        params_active=spec.params_active,
    )


def _memory_fields(lay: Layout, plan: MemoryPlan, cap: Capacity) -> dict:
    return dict(
        gpu_memory_bytes=lay.gpu.usable_bytes,
        weights_bytes=plan.weights,
        kv_bytes_per_token=plan.kv_bytes_per_token,
        kv_bytes_per_sequence=plan.kv_bytes_per_sequence,
        kv_cache_bytes=plan.kv_cache,
        kv_cache_tokens=cap.kv_tokens,
        activation_bytes=plan.activation,
        overhead_bytes=plan.overhead,
        cuda_graph_bytes=plan.cuda_graphs,
        total_bytes_per_gpu=plan.total,
        fits=plan.fits,
        fit_reason=plan.fit_reason,
        max_concurrency=cap.max_concurrency if plan.fits else 0,
        max_model_len_single=cap.longest_sequence,
    )


def _speed_fields(req: PlanRequest, lay: Layout, plan: MemoryPlan, spd: Speed) -> dict:
    price, n = lay.gpu.price_per_hour, req.num_gpus
    return dict(
        batch_size=spd.batch,
        prefill_tokens_per_s=spd.prefill_tps,
        ttft_s=spd.prefill_s if plan.fits else None,
        decode_tokens_per_s_per_seq=1 / spd.step_s,
        decode_tokens_per_s_total=spd.decode_total,
        tpot_s=spd.step_s if plan.fits else None,
        price_per_hour=price * n,
        cost_per_million_output_tokens=speed.cost_per_million(price, n, spd.decode_total),
        cost_per_million_input_tokens=speed.cost_per_million(price, n, spd.prefill_tps),
    )


def estimate_for_spec(req: PlanRequest, spec: ModelSpec) -> Estimate:
    """The estimate for one plan on one model spec (no fixes; advise.estimate adds them)."""
    lay = _layout(req, spec)
    plan = plan_memory(req, spec, lay)
    cap = _capacity(req, spec, lay, plan)
    spd = _speed(req, spec, lay, plan, cap.max_concurrency)
    return Estimate(
        **_request_fields(req, spec, lay, plan),
        **_memory_fields(lay, plan, cap),
        **_speed_fields(req, lay, plan, spd),
        memory_terms=plan_terms(req, spec, lay, plan),
        warnings=_warnings(req, spec, lay, plan, cap),
    )
