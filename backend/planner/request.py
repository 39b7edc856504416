"""The planner's input: one plan request, shared by the estimate, the exporters and the UI, and its checks."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from backend.engines import ENGINES
from backend.errors import UserError
from backend.planner.catalog import Quantization, get_quantization
from backend.planner.specs import ModelSpec

USAGE_CONTEXTS = ("openai_api_server", "llm_class")  # vLLM's UsageContext: `vllm serve` or `LLM(...)`
UsageContext = Literal["openai_api_server", "llm_class"]


@dataclass(slots=True)
class PlanRequest:
    """What a user asks the planner: a model, a quantization, GPUs and a workload.

    Field names follow vLLM where it has one (``max_model_len``, ``gpu_memory_utilization``,
    ``kv_cache_dtype``, ``max_num_seqs``, ``max_num_batched_tokens``). None means what the engine itself
    picks: vLLM's scheduler defaults depend on its version, the usage context and the GPU
    (backend/planner/vllm_rules.py).
    """

    model: str  # Hub id, local folder, GGUF file, or a bundled preset (named by its Hub id)
    gpu: str = "H100-80GB"  # short name from presets/gpus.yaml
    num_gpus: int = 1
    tp: int | None = None  # tensor parallel size; None = num_gpus // pp
    pp: int = 1  # pipeline parallel size
    dp: int = 1  # data parallel replicas (export only; each replica has tp * pp GPUs)
    enable_expert_parallel: bool = False
    quant: str = "auto"  # key in presets/quantizations.yaml; auto = as stored in the checkpoint
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None  # None = the model's limit
    input_len: int = 1024
    output_len: int = 256
    concurrency: int = 16
    gpu_memory_utilization: float = 0.92
    engine: str = "vllm"
    revision: str | None = None
    checkpoint: str | None = None  # Hub id or path holding the weights in `quant` (...-AWQ); None = model
    max_num_seqs: int | None = None  # None = the engine's default
    max_num_batched_tokens: int | None = None  # None = the engine's default
    block_size: int = 16
    enable_prefix_caching: bool = True
    enforce_eager: bool = False  # vLLM's: no CUDA graphs (the embedded engine: no captured decode step)
    vllm_version: str | None = None  # None = the version the export targets (vllm_rules.VLLM_TARGET_VERSION)
    usage_context: UsageContext = "openai_api_server"
    # vLLM's VLLM_USE_FLASHINFER_SAMPLER as it took effect (the log's topk_topp_sampler line); None = the
    # version's default (vllm_versions.VllmFamily.flashinfer_sampler_default)
    flashinfer_sampler: bool | None = None
    disable_custom_all_reduce: bool = False  # vLLM's flag, or vLLM turned it off (no P2P, across nodes)

    @property
    def tensor_parallel_size(self) -> int:
        return self.tp if self.tp is not None else max(self.num_gpus // max(self.pp, 1), 1)

    def to_dict(self) -> dict:
        return asdict(self)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise UserError(message)


def _check_counts(req: PlanRequest) -> None:
    _check(req.engine in ENGINES, f"unknown engine {req.engine!r}; choose one of: {', '.join(ENGINES)}")
    for name in ("num_gpus", "pp", "input_len", "output_len", "concurrency", "block_size"):
        value = getattr(req, name)
        _check(isinstance(value, int) and value >= 1, f"{name} must be an integer >= 1, got {value!r}")
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        value = getattr(req, name)
        _check(
            value is None or (isinstance(value, int) and value >= 1),
            f"{name} must be an integer >= 1 or None (the engine's default), got {value!r}",
        )
    _check(
        req.usage_context in USAGE_CONTEXTS,
        f"usage_context must be one of {', '.join(USAGE_CONTEXTS)}, got {req.usage_context!r}",
    )
    fi = req.flashinfer_sampler
    _check(
        fi is None or isinstance(fi, bool),
        f"flashinfer_sampler must be true, false or None (the vLLM version's default), got {fi!r}",
    )
    car = req.disable_custom_all_reduce
    _check(isinstance(car, bool), f"disable_custom_all_reduce must be true or false, got {car!r}")
    util = req.gpu_memory_utilization
    _check(
        isinstance(util, int | float) and 0 < util <= 1,
        f"gpu_memory_utilization must be in (0, 1], got {util!r}",
    )


def validate_request(req: PlanRequest, spec: ModelSpec) -> tuple[int, int]:
    """(tp, max_model_len) after checking every field; ValueError names the allowed values or range."""
    _check_counts(req)
    tp = req.tensor_parallel_size
    _check(isinstance(tp, int) and tp >= 1, f"tp must be an integer >= 1, got {req.tp!r}")
    per_replica = tp * req.pp
    _check(
        req.num_gpus % per_replica == 0,
        f"num_gpus ({req.num_gpus}) must be a multiple of tp x pp ({tp} x {req.pp} = {per_replica})",
    )
    heads = spec.num_attention_heads
    allowed = [n for n in range(1, min(heads, 64) + 1) if heads % n == 0]
    _check(heads % tp == 0, f"tp={tp} must divide the model's {heads} attention heads; allowed: {allowed}")
    limit = spec.max_position_embeddings
    max_len = req.max_model_len if req.max_model_len is not None else limit
    _check(
        isinstance(max_len, int) and 1 <= max_len <= limit,
        f"max_model_len must be an integer in [1, {limit}] (the model's limit), got {req.max_model_len!r}",
    )
    _check(
        req.input_len + req.output_len <= max_len,
        f"input_len + output_len = {req.input_len + req.output_len} exceeds max_model_len {max_len}; "
        f"allowed: at most {max_len} tokens together",
    )
    return tp, max_len


def resolve_quant(name: str, spec: ModelSpec) -> Quantization:
    """'auto' means the checkpoint as stored (its exact bytes when read from a tensor table)."""
    if name != "auto":
        return get_quantization(name)
    try:
        return get_quantization(spec.checkpoint_dtype)
    except ValueError:  # a GGUF type outside the catalog: its own average bits per weight
        bits = spec.weights_bytes * 8 / max(spec.params_total, 1)
        return Quantization(
            spec.checkpoint_dtype, spec.checkpoint_dtype, bits, (), "bf16", ("llamacpp", "ollama")
        )
