"""What an engine module declares about its engine, and the helpers they share for mapping plan values."""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.errors import Unsupported
from backend.export.plan import ExportPlan


@dataclass(slots=True, frozen=True)
class EngineInfo:
    name: str
    title: str
    version: str  # the engine release whose flags the module targets
    image: str | None = None  # official container image, pinned to `version` where the project tags them
    entrypoint: tuple[str, ...] = ()  # the part of the command the image's ENTRYPOINT already runs
    container_port: int = 8000
    health_path: str = "/health"
    metrics_path: str | None = "/metrics"
    api_base: str = "/v1"
    container_opts: tuple[str, ...] = ("--ipc=host",)  # shared memory for NCCL / worker processes
    pip: str = ""  # install line for a bare VM (SkyPilot)
    native_dp: bool = False  # one server runs dp replicas itself
    multi_node: bool = False  # the exporters know how to span nodes for this engine
    uses_gpu: bool = True
    served_name_flag: bool = True  # False: the engine answers to the model id only
    notes: tuple[str, ...] = field(default_factory=tuple)


def served_name(plan: ExportPlan, engine: EngineInfo) -> str:
    """The model name clients send to this engine."""
    return plan.served_name if engine.served_name_flag else plan.model


def map_quant(
    plan: ExportPlan, engine: EngineInfo, table: dict[str, str | None], alternative: str
) -> str | None:
    """The engine's name for the plan's quantization family (None = no flag); Unsupported otherwise."""
    if plan.quant not in table:
        supported = ", ".join(sorted(table))
        raise Unsupported(
            f"{engine.title} cannot serve {plan.req.quant!r} ({plan.quant}) weights; "
            f"it supports {supported}. "
            f"{alternative}"
        )
    return table[plan.quant]


def map_kv(plan: ExportPlan, engine: EngineInfo, table: dict[str, str | None]) -> str | None:
    """The engine's KV-cache dtype name (None = the engine's default); Unsupported otherwise."""
    dtype = plan.kv_cache_dtype
    if dtype not in table:
        allowed = ", ".join(sorted(table))
        raise Unsupported(f"{engine.title} has no KV cache dtype {dtype!r}; use one of {allowed}")
    return table[dtype]


def refuse_speculative(plan: ExportPlan, engine: EngineInfo, allowed: tuple[str, ...] = ()) -> None:
    method = plan.options.speculative_method
    if method is not None and method not in allowed:
        can = f"it supports {', '.join(allowed)}" if allowed else "it has no speculative decoding"
        raise Unsupported(
            f"{engine.title} cannot run speculative method {method!r} ({can}); use vLLM or SGLang, "
            "or turn speculative decoding off"
        )


def refuse_dp(plan: ExportPlan, engine: EngineInfo) -> None:
    if plan.dp > 1 and not engine.native_dp:
        raise Unsupported(
            f"{engine.title} has no data-parallel option; run {plan.dp} copies instead (the k8s format "
            "sets replicas) or set dp=1"
        )


def refuse_api_key(plan: ExportPlan, engine: EngineInfo) -> None:
    if plan.options.api_key_env:
        raise Unsupported(
            f"{engine.title} has no API key option; leave api_key_env empty and put an authenticating "
            "proxy in front, or use vLLM, SGLang or llama.cpp"
        )


def gguf_model(plan: ExportPlan, engine: EngineInfo) -> tuple[str, str]:
    """('-m', path) for a local .gguf file, ('-hf', 'repo:TYPE') for a Hub repo of GGUF files."""
    if plan.model.endswith(".gguf"):
        return "-m", plan.model
    if plan.local:
        raise Unsupported(f"{engine.title} needs a .gguf file, got the folder {plan.model!r}")
    if plan.quant != "gguf" or not plan.gguf_type:
        raise Unsupported(
            f"{engine.title} runs GGUF files only; choose a GGUF quantization such as Q4_K_M "
            f"(the Hub repo must hold GGUF files), or use vLLM or SGLang for {plan.req.quant!r} weights"
        )
    return "-hf", f"{plan.model}:{plan.gguf_type}"
