"""The planner's input: one plan request, shared by the estimate, the exporters and the UI, and its checks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Literal

from backend.engines import ENGINES
from backend.errors import UserError
from backend.knobs import check_number, knob, scalar_types
from backend.planner.catalog import (
    Quantization,
    get_quantization,
    list_gpus,
    list_kv_cache_dtypes,
    list_quantizations,
)
from backend.planner.specs import ModelSpec
from backend.planner.vllm_versions import VLLM_TARGET_VERSION, version_choices

USAGE_CONTEXTS = ("openai_api_server", "llm_class")  # vLLM's UsageContext: `vllm serve` or `LLM(...)`
UsageContext = Literal["openai_api_server", "llm_class"]


def weight_formats() -> tuple[str, ...]:
    return ("auto", *list_quantizations())


def vllm_versions() -> tuple[str, ...]:
    """The export's target first (what None stands for), then each family's first release."""
    return tuple(version_choices(VLLM_TARGET_VERSION))


@dataclass(slots=True)
class PlanRequest:
    """What a user asks the planner: a model, a quantization, GPUs and a workload.

    Field names follow vLLM where it has one (``max_model_len``, ``gpu_memory_utilization``,
    ``kv_cache_dtype``, ``max_num_seqs``, ``max_num_batched_tokens``). None means what the engine itself
    picks: vLLM's scheduler defaults depend on its version, the usage context and the GPU
    (backend/planner/vllm_rules.py).

    Each field's metadata (backend/knobs.py: help, label, choices, range) makes the `estimate` and
    `export` CLI flags and the Plan tab's inputs; flashinfer_sampler is internal (validation runs set it).
    """

    model: str = knob(
        help="a preset, a Hub id, a local model folder or a .gguf file", label="Model", form=True
    )
    gpu: str = knob(
        "H100-80GB", "GPU short name from presets/gpus.yaml (CPU: no GPU)", list_gpus, label="GPU",
        is_open=True, form=True,
    )  # fmt: skip
    num_gpus: int = knob(
        1, "GPUs per replica (= tp x pp)", minimum=1, label="GPUs", noun="number of GPUs", form=True
    )
    tp: int | None = knob(
        None, "tensor parallel size; unset = num_gpus / pp", minimum=1,
        label="Tensor parallel (0 = all GPUs)", noun="tensor parallel size", form=True,
    )  # fmt: skip
    pp: int = knob(
        1, "pipeline parallel size", minimum=1, label="Pipeline parallel", noun="pipeline parallel size",
        form=True,
    )  # fmt: skip
    dp: int = knob(1, "data parallel replicas (export only; each replica has tp x pp GPUs)", minimum=1)
    enable_expert_parallel: bool = knob(False, "experts split across the GPUs (MoE models)")
    quant: str = knob(
        "auto", "weight format from presets/quantizations.yaml; auto = as stored in the checkpoint",
        weight_formats, label="Weights (auto = as stored)", is_open=True, form=True,
    )  # fmt: skip
    kv_cache_dtype: str = knob(
        "auto", "KV cache storage (vLLM's names and aliases: bfloat16, fp8_e4m3, ...)", list_kv_cache_dtypes,
        label="KV cache dtype", is_open=True, form=True,
    )  # fmt: skip
    max_model_len: int | None = knob(
        None, "context length; unset = the model's limit", minimum=1, label="max_model_len (0 = model limit)",
        noun="max_model_len", form=True,
    )  # fmt: skip
    input_len: int = knob(
        1024, "prompt tokens per request", minimum=1, label="Input tokens / request",
        noun="input length (tokens)", form=True,
    )  # fmt: skip
    output_len: int = knob(
        256, "generated tokens per request", minimum=1, label="Output tokens / request",
        noun="output length (tokens)", form=True,
    )  # fmt: skip
    concurrency: int = knob(
        16, "requests served at once", minimum=1, label="Concurrent requests", noun="concurrency", form=True
    )
    # vLLM's CacheConfig: Field(gt=0, le=1)
    gpu_memory_utilization: float = knob(
        0.92, "share of each GPU's memory the engine may use", minimum=0.0, maximum=1.0,
        is_minimum_exclusive=True, step=0.01, label="gpu_memory_utilization", form=True,
    )  # fmt: skip
    engine: str = knob("vllm", "serving engine", ENGINES, label="Serving engine", form=True)
    revision: str | None = knob(None, "branch, tag or commit of the Hub repo")
    checkpoint: str | None = knob(
        None, "the Hub id or path holding weights in this quantization; empty = the model itself",
        label="Quantized checkpoint (for the export)", form=True,
    )  # fmt: skip
    max_num_seqs: int | None = knob(
        None, "most requests in one step; unset = the engine's default", minimum=1
    )
    max_num_batched_tokens: int | None = knob(
        None, "token budget of one step; unset = the engine's default", minimum=1
    )
    block_size: int = knob(16, "tokens per KV-cache block", minimum=1)
    enable_prefix_caching: bool = knob(True, "reuse the KV blocks of shared prompt prefixes")
    enforce_eager: bool = knob(
        False, "no CUDA graphs (vLLM's flag; the embedded engine: no captured decode step), so none counted"
    )
    vllm_version: str | None = knob(
        None, "vLLM whose defaults and accounting to follow; unset = the version the export targets",
        vllm_versions, label="vLLM version (its defaults and accounting)", is_open=True, form=True,
    )  # fmt: skip
    usage_context: Literal["openai_api_server", "llm_class"] = knob(  # = UsageContext (RUF009 reads no alias)
        "openai_api_server", "vllm serve or LLM(...)", USAGE_CONTEXTS
    )
    # vLLM's VLLM_USE_FLASHINFER_SAMPLER as it took effect (the log's topk_topp_sampler line); None = the
    # version's default (vllm_versions.VllmFamily.flashinfer_sampler_default). Internal: validation runs.
    flashinfer_sampler: bool | None = knob(None, "as vLLM's log says it took effect", cli=False)
    disable_custom_all_reduce: bool = knob(
        False, "vLLM's flag, or vLLM turned it off (no P2P, across nodes): NCCL only"
    )

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
    kinds = scalar_types(PlanRequest)
    for f in fields(PlanRequest):  # each number in its knob's range; tp and max_model_len: the model's too
        if kinds[f.name] in (int, float) and f.name not in ("tp", "max_model_len"):
            check_number(f, getattr(req, f.name), kinds[f.name])
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
