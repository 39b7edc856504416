"""Can this machine run a plan on the embedded engine? The Plan tab's "Launch this plan here".

decide() takes a plan over to an EngineConfig (model, dtype, block_size, max_num_seqs,
max_num_batched_tokens, max_model_len, prefix caching) when this machine can run it, and otherwise says
exactly why not: the weights are neither on this machine nor downloadable (no Hub access), the
quantization needs a checkpoint stored that way, the engine has no class for the model's architecture
(backend/model_support.py, the check Launch makes), or the planner's own estimate for this machine (the
embedded engine on this CPU, or on its GPU) needs more memory than is free. It then offers the nearest
thing that runs: the largest smaller preset that fits (when the Hub answers), else the default model;
and the Export tab for the plan's own GPUs. The machine (LocalHardware) and the Hub's reachability are
arguments, so the decision is tested without either.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from backend.default_model import DEFAULT_HUB_ID, DEFAULT_MODEL_NAME
from backend.engine.config import KV_CACHE_DTYPES, EngineConfig, config_field
from backend.model_support import UnsupportedArchitecture, refuse_unsupported
from backend.planner.advise import estimate
from backend.planner.catalog import LOCAL_CPU, list_presets
from backend.planner.hardware import LocalHardware
from backend.planner.request import PlanRequest

GIB = 1024**3
MIB = 1024**2
DTYPES = {"auto": "auto", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
MIN_KV_BYTES = 256 * MIB  # the Launch tab's default pool (ui/launch_tab.py DEFAULT_KV_MIB)
DEFAULT_MAX_NUM_SEQS: int = config_field("max_num_seqs").default  # type: ignore[assignment]
DEFAULT_MAX_NUM_BATCHED_TOKENS: int = config_field("max_num_batched_tokens").default  # type: ignore[assignment]
HEADROOM = 0.9  # share of free memory a launch may plan to use; the rest stays for the app and the OS


@dataclass(slots=True)
class LaunchDecision:
    """The verdict on one plan for this machine."""

    can_launch: bool
    config: EngineConfig | None  # what Launch gets when can_launch
    reasons: list[str]  # why not (empty when it can), each naming the numbers
    notes: list[str] = field(default_factory=list)  # differences from the plan that do not stop it
    alternative: EngineConfig | None = None  # the nearest thing that runs here
    alternative_why: str = ""  # what the alternative is, in one line
    export_hint: str = ""  # the plan's own deployment, through the Export tab
    needed_bytes: int | None = None  # the planner's estimate for this machine
    available_bytes: int = 0  # free memory of the device it would run on


def is_local(model: str) -> bool:
    return Path(model).expanduser().exists()


def local_model(plan: PlanRequest, default_gguf: str | None) -> str:
    """The weights to load: the quantized checkpoint named in the plan, else the model; the default
    model's Hub id becomes its packaged GGUF when that is installed (the same model, no download)."""
    model = plan.checkpoint or plan.model
    return default_gguf if model == DEFAULT_HUB_ID and default_gguf else model


def engine_config(plan: PlanRequest, model: str, dtype: str) -> EngineConfig:
    """The plan's limits on the embedded engine; a KV pool for one max_model_len sequence at least."""
    return EngineConfig(
        model=model,
        dtype=dtype,
        block_size=plan.block_size,
        max_num_seqs=plan.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens=plan.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_model_len=plan.max_model_len,
        enable_prefix_caching=plan.enable_prefix_caching,
        kv_cache_memory_bytes=MIN_KV_BYTES,
        kv_cache_dtype=plan.kv_cache_dtype if plan.kv_cache_dtype in KV_CACHE_DTYPES else "auto",
    )


def memory_needed(plan: PlanRequest, model: str, machine: LocalHardware) -> tuple[int, int, int]:
    """(bytes the planner expects the embedded engine to need here, free bytes, KV pool bytes to ask)."""
    gpu = next((g for g in machine.gpus if g.catalog_name), None)
    quant = plan.quant if plan.quant in DTYPES or model.endswith(".gguf") else "auto"
    catalog = gpu.catalog_name if gpu is not None and gpu.catalog_name else "CPU"
    local = replace(plan, model=model, gpu=catalog, engine="embedded", quant=quant)
    local = replace(local, num_gpus=1, tp=1, pp=1, dp=1, checkpoint=None)
    est = estimate(local)
    one_sequence = int(est.kv_bytes_per_token * (plan.max_model_len or plan.input_len + plan.output_len))
    kv = max(MIN_KV_BYTES, one_sequence)
    needed = int(est.weights_bytes + est.activation_bytes + est.overhead_bytes + est.cuda_graph_bytes + kv)
    return needed, gpu.memory_free_bytes if gpu else machine.ram_available_bytes, kv


def running_engine_request(
    model: str,
    dtype: str,
    quantized: bool,
    kv_cache_dtype: str = "auto",
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    enforce_eager: bool = False,
    **workload: Any,
) -> PlanRequest:
    """The plan of the embedded engine as it runs here (from its config and stats), on this machine's CPU
    (catalog.LOCAL_CPU: its cores and ISA set the speed figures): quant "auto" when it
    computes from the checkpoint as stored, else the dtype it holds the weights in; its max_model_len, with
    a workload inside it unless one is given; its max_num_seqs, and enforce_eager when it captured no decode
    step (stats' decode_graph_bytes 0), which size the captured step's buffers. The one place the Launch
    card, the Benchmark tab and the Compare tab get the planner's view of the running engine."""
    names = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
    quant = "auto" if quantized else names.get(dtype.removeprefix("torch."), "fp32")
    kv = kv_cache_dtype if kv_cache_dtype in KV_CACHE_DTYPES else "auto"
    if max_model_len:  # weights and KV bytes a token do not depend on it; the request must be valid
        workload.setdefault("input_len", min(1024, max(max_model_len // 2, 1)))
        workload.setdefault("output_len", max(min(256, max_model_len - workload["input_len"]), 1))
    return PlanRequest(
        model=model,
        gpu=LOCAL_CPU,
        engine="embedded",
        quant=quant,
        kv_cache_dtype=kv,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        enforce_eager=enforce_eager,
        **workload,
    )


def running_engine_plan(config: Any, stats: Any, **workload: Any) -> PlanRequest:
    """running_engine_request for a running engine from its EngineConfig and EngineStats: as stored when it
    reports a quantization, its KV dtype, max_model_len and max_num_seqs, enforce_eager when it captured no
    decode step (the Launch card, the Benchmark tab and the Compare tab alike)."""
    return running_engine_request(
        config.model,
        stats.dtype,
        stats.quantization is not None,
        config.kv_cache_dtype,
        stats.max_model_len,
        config.max_num_seqs,
        stats.decode_graph_bytes == 0,
        **workload,
    )


def check_weights(plan: PlanRequest, model: str, hub_online: bool) -> list[str]:
    reasons = []
    if not is_local(model) and not hub_online:
        reasons.append(
            f"no Hub access: {model} is not on this machine and the Hugging Face Hub is unreachable "
            "(give a local folder or .gguf file in Model)"
        )
    if plan.quant not in DTYPES and not model.endswith(".gguf") and not plan.checkpoint:
        reasons.append(
            f"{plan.quant} weights need a checkpoint stored that way: name it in 'Quantized checkpoint', "
            "or plan with bf16 to run the original weights here"
        )
    return reasons


def check_architecture(model: str) -> list[str]:
    """Why the engine cannot run the model's architecture (its config read as Launch reads it), if so."""
    try:
        refuse_unsupported(model)
    except UnsupportedArchitecture as exc:
        return [str(exc)]
    return []


def decide(
    plan: PlanRequest, machine: LocalHardware, hub_online: bool, default_gguf: str | None
) -> LaunchDecision:
    """Whether the embedded engine on this machine can run the plan, and what instead when not."""
    model = local_model(plan, default_gguf)
    reasons = check_weights(plan, model, hub_online) + check_architecture(model)
    notes = gpu_notes(plan, machine)
    needed, available, kv = None, 0, MIN_KV_BYTES
    try:
        needed, available, kv = memory_needed(plan, model, machine)
    except (ValueError, OSError) as exc:  # a model the planner cannot read here (offline, unknown)
        reasons.append(f"the planner cannot size {model} on this machine: {exc}")
    where = f"{machine.gpus[0].name} GPU" if machine.gpus else "this machine's RAM"
    if needed is not None and needed > available * HEADROOM:
        reasons.append(
            f"not enough memory: the planner estimates {needed / GIB:.2f} GiB for {Path(model).name} "
            f"on the embedded engine, and {where} has {available / GIB:.2f} GiB free "
            f"({HEADROOM:.0%} usable)"
        )
    export = f"Export tab: launch files for {plan.engine} on {plan.num_gpus} × {plan.gpu}"
    dtype = DTYPES.get(plan.quant, "auto")
    if not reasons:
        config = replace(engine_config(plan, model, dtype), kv_cache_memory_bytes=kv)
        return LaunchDecision(
            True, config, [], notes, export_hint=export, needed_bytes=needed, available_bytes=available
        )
    alternative, why = nearest_runnable(plan, machine, hub_online, default_gguf, needed)
    return LaunchDecision(
        False, None, reasons, notes, alternative, why, export, needed_bytes=needed, available_bytes=available
    )


def gpu_notes(plan: PlanRequest, machine: LocalHardware) -> list[str]:
    """What differs from the plan without stopping the launch: the device, a KV dtype it lacks."""
    notes = []
    if plan.kv_cache_dtype not in (*KV_CACHE_DTYPES, "bf16", "fp16", "fp32"):
        notes.append(f"KV cache {plan.kv_cache_dtype}: the embedded engine keeps it in the model's dtype")
    if plan.gpu == "CPU":
        return notes
    if not machine.gpus:
        cpu = f"{machine.cpu_model}, {machine.cpu_cores_logical} cores"
        where = f"the embedded engine would run on this CPU ({cpu}), much slower"
        return [*notes, f"no GPU here: the plan is for {plan.num_gpus} × {plan.gpu}, {where}"]
    gpu = machine.gpus[0].name
    return [*notes, f"runs on one {gpu} with the embedded engine, not on {plan.num_gpus} × {plan.gpu}"]


def nearest_runnable(
    plan: PlanRequest, machine: LocalHardware, hub_online: bool, default_gguf: str | None, needed: int | None
) -> tuple[EngineConfig | None, str]:
    """The largest preset smaller than the plan's model that fits here (Hub needed), else the default."""
    if hub_online:
        fits = []
        for preset in list_presets():
            if check_architecture(preset):  # a preset of an architecture the engine lacks runs nowhere here
                continue
            small = replace(plan, model=preset, quant="bf16", checkpoint=None)
            try:
                need, free, kv = memory_needed(small, preset, machine)
            except (ValueError, OSError):
                continue
            if need <= free * HEADROOM and (needed is None or need < needed) and preset != plan.model:
                fits.append((need, preset, kv))
        if fits:  # the same family first (its organisation), then the largest
            family = plan.model.split("/")[0]
            need, preset, kv = max(fits, key=lambda fit: (fit[1].split("/")[0] == family, fit[0]))
            config = replace(engine_config(plan, preset, "bfloat16"), kv_cache_memory_bytes=kv)
            return config, f"{preset} in bf16, the largest preset that fits here ({need / GIB:.2f} GiB)"
    model = default_gguf or DEFAULT_HUB_ID
    if not default_gguf and not hub_online:
        return None, ""
    small = replace(plan, max_model_len=None, max_num_batched_tokens=None, max_num_seqs=None, quant="auto")
    kind = "its packaged Q4_1 GGUF" if default_gguf else "from the Hub"
    return engine_config(
        small, model, "auto"
    ), f"the default model {DEFAULT_MODEL_NAME} ({kind}), which runs here"
