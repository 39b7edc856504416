"""The public estimate and the advice on top of it: fixes for a plan that does not fit (with the
concurrency the first one gives) and every GPU side by side (the recommendation is in recommend.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from backend.engines import CPU_ENGINES, ENGINE_TRAITS  # CPU_ENGINES: also run on a CPU-only host
from backend.planner.catalog import GIB, get_quantization, list_gpus, list_quantizations
from backend.planner.estimate import Estimate, estimate_for_spec
from backend.planner.request import PlanRequest, resolve_quant
from backend.planner.sources import load_model_spec
from backend.planner.specs import ModelSpec

GPU_COUNTS = (1, 2, 4, 8)


@dataclass(slots=True, frozen=True)
class Fix:
    """One change that makes a plan fit, checked by re-estimating it."""

    text: str
    max_concurrency: int  # input_len + output_len sequences at once after the change


def estimate(req: PlanRequest) -> Estimate:
    """The estimate for one plan; when it does not fit, est.fixes lists concrete changes that would, and
    est.max_concurrency_after_fix is the concurrency after the first of them."""
    spec = load_model_spec(req.model, req.revision)
    est = estimate_for_spec(req, spec)
    if not est.fits:
        fixes = suggest_fixes(req, spec, est)
        est.fixes = [fix.text for fix in fixes]
        est.max_concurrency_after_fix = fixes[0].max_concurrency if fixes else None
    return est


def try_estimate(req: PlanRequest, spec: ModelSpec, **changes) -> Estimate | None:
    try:
        return estimate_for_spec(replace(req, **changes), spec)
    except ValueError:
        return None


def tp_options(spec: ModelSpec, above: int) -> list[int]:
    return [n for n in GPU_COUNTS if n > above and spec.num_attention_heads % n == 0]


def _fit_with(req: PlanRequest, spec: ModelSpec, **changes) -> tuple[Estimate, str] | None:
    """The plan with `changes` if it fits, else with max_model_len lowered to what then fits
    (when that still holds one input_len + output_len request); the suffix names the second change."""
    trial = try_estimate(req, spec, **changes)
    if trial is None or trial.fits:
        return (trial, "") if trial else None
    length = trial.max_model_len_single
    if trial.kv_cache_bytes > 0 and length >= req.input_len + req.output_len:
        shorter = try_estimate(req, spec, **changes, max_model_len=length)
        if shorter and shorter.fits:
            return shorter, f" and lower max_model_len to {length}"
    return None


def _fix(text: str, trial: Estimate) -> Fix:
    return Fix(text, trial.max_concurrency)


def _quantize(req: PlanRequest, spec: ModelSpec, est: Estimate) -> Fix | None:
    current_bits = resolve_quant(req.quant, spec).bits
    smaller = sorted((get_quantization(q) for q in list_quantizations()), key=lambda q: -q.bits)
    gguf_ok = req.engine in CPU_ENGINES  # vLLM's GGUF loader is experimental: do not advise it
    # only formats with at least a quarter fewer bits: 4-bit to another 4-bit format is no fix
    for quant in [q for q in smaller if q.bits <= 0.75 * current_bits and req.engine in q.engines]:
        if quant.name.startswith("gguf-") and not gguf_ok:
            continue
        if found := _fit_with(req, spec, quant=quant.name):
            trial, also = found
            weights = f"weights {trial.weights_bytes / GIB:.1f} GiB per GPU"
            text = f"quantize to {quant.name} ({quant.label}){also}: {weights}"
            return _fix(text, trial)
    return None


def _fp8_kv_cache(req: PlanRequest, spec: ModelSpec, est: Estimate) -> Fix | None:
    if req.kv_cache_dtype not in ("auto", "bf16", "fp16") or req.engine not in (
        "vllm",
        "sglang",
        "trtllm",
        "tgi",
    ):
        return None
    trial = try_estimate(req, spec, kv_cache_dtype="fp8")
    if trial and trial.fits:
        return _fix("use an fp8 KV cache (--kv-cache-dtype fp8): half the KV bytes per token", trial)
    return None


def _tensor_parallel(req: PlanRequest, spec: ModelSpec, est: Estimate) -> Fix | None:
    for tp in tp_options(spec, est.tp):
        if found := _fit_with(req, spec, tp=tp, num_gpus=tp * req.pp):
            trial, also = found
            text = (
                f"use tensor parallel TP={tp} on {tp * req.pp} x {est.gpu}{also}: weights "
                f"{trial.weights_bytes / GIB:.1f} GiB per GPU"
            )
            return _fix(text, trial)
    return None


def _shorter_context(req: PlanRequest, spec: ModelSpec, est: Estimate) -> Fix | None:
    length = est.max_model_len_single
    if est.weights_bytes >= est.gpu_memory_bytes or length < req.input_len + req.output_len:
        return None
    trial = try_estimate(req, spec, max_model_len=length)
    if trial and trial.fits:
        return _fix(f"lower max_model_len to {length} (the longest sequence the KV cache holds)", trial)
    return None


def _more_utilization(req: PlanRequest, spec: ModelSpec, est: Estimate) -> Fix | None:
    if req.gpu_memory_utilization >= 0.95 or not ENGINE_TRAITS[req.engine].sized_by_utilization:
        return None
    trial = try_estimate(req, spec, gpu_memory_utilization=0.95)
    return _fix("raise gpu_memory_utilization to 0.95", trial) if trial and trial.fits else None


def _bigger_gpu(req: PlanRequest, spec: ModelSpec, est: Estimate) -> Fix | None:
    gpus = [g for g in list_gpus() if g != est.gpu and (g != "CPU" or req.engine in CPU_ENGINES)]
    bigger = [t for t in (try_estimate(req, spec, gpu=g) for g in gpus) if t and t.fits]
    if not bigger:
        return None
    best = min(bigger, key=lambda t: t.price_per_hour)
    return _fix(f"use a {best.gpu} (${best.price_per_hour:.2f}/h for {best.num_gpus})", best)


FIXES = (_quantize, _fp8_kv_cache, _tensor_parallel, _shorter_context, _more_utilization, _bigger_gpu)


def suggest_fixes(req: PlanRequest, spec: ModelSpec, est: Estimate) -> list[Fix]:
    """Concrete changes, each checked by re-estimating, that make a plan fit; in FIXES order."""
    return [fix for fix in (find(req, spec, est) for find in FIXES) if fix is not None]


def compare_gpus(req: PlanRequest) -> list[Estimate]:
    """The same plan on every GPU of the catalog (the CPU host only for CPU-capable engines)."""
    spec = load_model_spec(req.model, req.revision)
    cpu_ok = req.engine in CPU_ENGINES
    return [estimate_for_spec(replace(req, gpu=g), spec) for g in list_gpus() if g != "CPU" or cpu_ok]
