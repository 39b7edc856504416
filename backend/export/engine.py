"""The interface every engine exporter implements, and the helpers they share for mapping plan values.

An engine module defines one `Exporter` subclass: its `INFO` (facts about the engine) and the hooks the
format builders (scripts, compose, k8s, SkyPilot, endpoint) call. The builders never ask which engine
they are building for: whatever differs is a hook or an `EngineInfo` field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

__all__ = ["EngineInfo", "Exporter", "Unsupported"]

from backend.engines import ENGINE_TRAITS
from backend.errors import Unsupported
from backend.export.base import EnvRef, Token
from backend.export.plan import ExportPlan

HF_CACHE = "/root/.cache/huggingface"


@dataclass(slots=True, frozen=True)
class EngineInfo:
    name: str  # a row of backend/engines.ENGINE_TRAITS
    version: (
        str  # the engine release whose flags the module targets (tests/data/engine_flags/NAME-VERSION.json)
    )
    image: str | None = None  # official container image, pinned to `version` where the project tags them
    entrypoint: tuple[str, ...] = ()  # the part of the command the image's ENTRYPOINT already runs
    container_port: int = 8000
    health_path: str = "/health"
    metrics_path: str | None = "/metrics"
    api_base: str = "/v1"
    container_opts: tuple[str, ...] = ("--ipc=host",)  # shared memory for NCCL / worker processes
    pip: str = ""  # install lines for a bare VM (SkyPilot setup)
    hf_endpoint: bool = False  # exported as a Hugging Face Inference Endpoint (custom container)
    vm_image: bool = False  # SkyPilot runs the command inside `image` (no pip install of the engine)
    native_dp: bool = False  # one server runs dp replicas itself
    multi_node: bool = False  # the exporters know how to span nodes for this engine
    uses_gpu: bool = True
    served_name_flag: bool = True  # False: the engine answers to the model id only
    api_key_env: str | None = None  # the variable the engine reads its API key from (never a command line)
    cache_dir: str = HF_CACHE  # where the image keeps downloaded weights: a volume goes there
    runs_in_checkout: bool = False  # commands run from this project's checkout (the embedded engine)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def title(self) -> str:
        return ENGINE_TRAITS[self.name].title


class Exporter:
    """One engine's export. Subclasses set INFO and implement `command`; the other hooks have defaults."""

    INFO: ClassVar[EngineInfo]

    def check(self, plan: ExportPlan) -> None:
        """Raise Unsupported when the engine cannot run the plan (called before any file is built)."""

    def command(self, plan: ExportPlan, host: str, port: int) -> list[Token]:
        raise NotImplementedError

    def container_args(self, plan: ExportPlan) -> list[Token]:
        """The command inside the engine's image: without the part its ENTRYPOINT already runs."""
        argv = self.command(plan, "0.0.0.0", self.INFO.container_port)
        return argv[len(self.INFO.entrypoint) :]

    def environment(self, plan: ExportPlan, host: str, port: int) -> dict[str, str | EnvRef]:
        """Variables the server reads (the API key, when the engine reads it from the environment)."""
        key = plan.options.api_key_env
        if key and self.INFO.api_key_env:
            return {self.INFO.api_key_env: EnvRef(key)}
        return {}

    def extra_files(self, plan: ExportPlan) -> dict[str, str]:
        """Files the command reads from its working directory (mounted at /config in containers)."""
        return {}

    def python_snippet(self, plan: ExportPlan) -> str:
        raise Unsupported(f"{self.INFO.title} has no Python API export; use the shell or docker format")

    def post_start(self, plan: ExportPlan) -> list[list[str]]:
        """Commands to run once the server answers (e.g. `ollama create`), in its container or shell."""
        return []

    def ready_check(self) -> list[str]:
        """A command that succeeds once the server answers (compose healthcheck, waiting in scripts)."""
        url = f"http://localhost:{self.INFO.container_port}{self.INFO.health_path}"
        return ["python3", "-c", f"import urllib.request; urllib.request.urlopen({url!r})"]

    def client_model(self, plan: ExportPlan) -> str:
        """The model name clients send to this engine."""
        return plan.served_name if self.INFO.served_name_flag else plan.checkpoint


def map_quant(
    plan: ExportPlan, engine: EngineInfo, table: Mapping[str, str | None], alternative: str
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


def map_kv(plan: ExportPlan, engine: EngineInfo, table: Mapping[str, str | None]) -> str | None:
    """The engine's KV-cache dtype name (None = the engine's default); Unsupported otherwise."""
    dtype = plan.kv_cache_dtype
    if dtype not in table:
        allowed = ", ".join(sorted(table))
        raise Unsupported(f"{engine.title} has no KV cache dtype {dtype!r}; use one of {allowed}")
    return table[dtype]


def speculative_config(plan: ExportPlan) -> dict | None:
    """vLLM's speculative_config for the plan, which the embedded engine takes as it is."""
    opts = plan.options
    if opts.speculative_method is None:
        return None
    config: dict = {"method": opts.speculative_method, "num_speculative_tokens": opts.num_speculative_tokens}
    if opts.speculative_method == "ngram":
        config["prompt_lookup_max"] = 4
    else:
        config["model"] = opts.speculative_model
    return config


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


def need_checkpoint(plan: ExportPlan, engine: EngineInfo, online: tuple[str, ...] = ()) -> None:
    """Quantized weights must come from a checkpoint that holds them; `online` families the engine can
    quantize at load time from the bf16 model (vLLM and SGLang: fp8)."""
    if plan.quant in ("none", "gguf") or plan.has_quantized_checkpoint or plan.quant in online:
        return
    raise Unsupported(
        f"{engine.title} serves {plan.quant} weights from a checkpoint that holds them, and {plan.model!r} "
        f"is the unquantized model; set the plan's quantized checkpoint (e.g. "
        f"{plan.suggested_checkpoint()!r}) or choose bf16"
    )


def gguf_model(plan: ExportPlan, engine: EngineInfo) -> tuple[str, str]:
    """('-m', path) for a local .gguf file, ('-hf', 'repo:TYPE') for a Hub repo of GGUF files."""
    model = plan.checkpoint
    if model.endswith(".gguf"):
        return "-m", model
    if plan.local:
        raise Unsupported(f"{engine.title} needs a .gguf file, got the folder {model!r}")
    if plan.quant != "gguf" or not plan.gguf_type:
        raise Unsupported(
            f"{engine.title} runs GGUF files only; choose a GGUF quantization such as Q4_K_M "
            f"(the Hub repo must hold GGUF files), or use vLLM or SGLang for {plan.req.quant!r} weights"
        )
    return "-hf", f"{model}:{plan.gguf_type}"


def gguf_file_only(plan: ExportPlan, engine: EngineInfo) -> None:
    """Engines that read one GGUF file and cannot pick one out of a Hub repo of many."""
    if plan.quant == "gguf" and not plan.checkpoint.endswith(".gguf"):
        raise Unsupported(
            f"{engine.title} loads GGUF from one local .gguf file (a Hub repo holds one file per "
            "quantization); download the file and pass its path, or use llama.cpp or Ollama"
        )
