"""The plan as exporters see it: the PlanRequest checked and resolved to concrete numbers once.

Every engine module reads the same ExportPlan, so the numbers agree across engines; the memory fractions
are converted from one KV-cache budget into each engine's own meaning here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from backend.export.base import ExportOptions, check_model, check_options, check_revision, is_local_path
from backend.model_names import served_model_name
from backend.planner.request import PlanRequest
from backend.planner.vllm_rules import with_scheduler_defaults

GGUF_TYPE = re.compile(r"^(?:gguf[-_:]?)?((?:i?q\d[a-z0-9_]*)|f16|bf16|f32)$", re.IGNORECASE)
KV_DTYPES = (
    "auto", "bf16", "bfloat16", "fp16", "float16", "fp32",
    "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "q8_0", "q4_0",
)  # fmt: skip


def quant_family(quant: str) -> str:
    """Map a quantization key (the planner's catalog names) to a family the engine modules understand."""
    q = quant.strip().lower()
    if q in ("bf16", "fp16", "float16", "bfloat16", "fp32", "float32", "none", "auto", ""):
        return "none"
    if q.endswith(".gguf") or q.startswith("gguf") or GGUF_TYPE.match(q):
        return "gguf"
    for family in ("awq", "gptq", "nvfp4", "mxfp4", "fp8"):
        if family in q:
            return family
    if "nf4" in q or "bnb" in q or "bitsandbytes" in q:
        return "bitsandbytes"
    if q in ("int8", "w8a8", "w8a8-int8", "int8-w8a8"):
        return "int8"
    raise ValueError(
        f"unknown quantization {quant!r}; known families: bf16/fp16, fp8, int8 (W8A8), awq, gptq, "
        "bitsandbytes (nf4), mxfp4, nvfp4, GGUF types such as Q4_K_M"
    )


# The usual Hub naming of quantized checkpoints, per family (the Plan tab suggests these).
CHECKPOINT_SUFFIX = {
    "awq": "-AWQ", "gptq": "-GPTQ-Int4", "fp8": "-FP8", "int8": "-quantized.w8a8", "nvfp4": "-NVFP4",
    "mxfp4": "-MXFP4", "bitsandbytes": "-bnb-4bit",
}  # fmt: skip
# Words in a repo id that say it already holds weights of that family.
CHECKPOINT_MARKERS = {
    "awq": ("awq",), "gptq": ("gptq",), "fp8": ("fp8",), "int8": ("w8a8", "int8"), "nvfp4": ("nvfp4", "fp4"),
    "mxfp4": ("mxfp4", "gpt-oss"), "bitsandbytes": ("bnb", "4bit", "nf4"),
}  # fmt: skip


def suggest_checkpoint(model: str, quant: str) -> str | None:
    """The usual name of `model`'s checkpoint in the quantization's family (None: no suffix convention)."""
    family = quant_family(quant)
    if family not in CHECKPOINT_SUFFIX or is_local_path(model):
        return None
    return model + CHECKPOINT_SUFFIX[family]


def gguf_type(quant: str) -> str | None:
    """'Q4_K_M' for 'gguf-q4_k_m' / 'Q4_K_M'; None when the key names no GGUF type."""
    match = GGUF_TYPE.match(quant.strip())
    return match.group(1).upper() if match else None


@dataclass(slots=True)
class ExportPlan:
    """Resolved, validated values shared by every exporter."""

    req: PlanRequest
    options: ExportOptions
    model: str
    local: bool
    served_name: str
    tp: int
    pp: int
    dp: int
    max_model_len: int
    quant: str  # the family: none, fp8, int8, awq, gptq, bitsandbytes, mxfp4, nvfp4, gguf
    gguf_type: str | None  # "Q4_K_M" for a GGUF quantization of a Hub repo
    kv_cache_dtype: str
    gpu_memory_utilization: float
    kv_cache_bytes: int | None  # per GPU, from the estimate
    weights_bytes: int | None  # per GPU
    gpu_memory_bytes: int | None
    max_num_seqs: int
    checkpoint: str = ""  # what the engines load: the quantized checkpoint when the plan names one
    kv_capacity_tokens: int | None = None  # KV tokens that fit beside weights and activations (estimate)
    weights_format: str = ""  # the estimate's resolved quantization ("fp32": a float32 checkpoint as stored)
    warnings: list[str] = field(default_factory=list)

    @property
    def dtype(self) -> str:
        """The engines' --dtype: the one asked for; for an fp32 plan (asked for, or a float32 checkpoint as
        stored) float32, since "auto" halves what the estimate counted (vLLM runs a float32 checkpoint in
        fp16, or bf16 on a CPU: "Downcasting torch.float32 to torch.bfloat16"); else auto, the
        checkpoint's own 16-bit type."""
        fp32 = self.req.quant.strip().lower() in ("fp32", "float32") or self.weights_format == "fp32"
        if self.options.dtype == "auto" and fp32:
            return "float32"
        return self.options.dtype

    @property
    def max_num_batched_tokens(self) -> int:
        assert self.req.max_num_batched_tokens is not None  # resolve() filled the engine's default
        return self.req.max_num_batched_tokens

    @property
    def has_quantized_checkpoint(self) -> bool:
        """The weights the engines load are already in the plan's quantization family."""
        if self.checkpoint != self.model or self.quant in ("none", "gguf"):
            return True
        name = self.model.lower()
        return any(marker in name for marker in CHECKPOINT_MARKERS.get(self.quant, ()))

    def suggested_checkpoint(self) -> str:
        return suggest_checkpoint(self.model, self.req.quant) or f"{self.model}-{self.quant.upper()}"

    def container_gpus(self, native_dp: bool) -> int:
        """GPUs one container (or pod) of the engine needs: a replica's, times dp when it runs them all."""
        return self.gpus_per_replica * (self.dp if native_dp else 1)

    @property
    def local_model_dir(self) -> str | None:
        """The folder a container mounts for a local model (the model's, or the one holding the .gguf)."""
        if not self.local:
            return None
        return str(Path(self.checkpoint).parent) if self.checkpoint.endswith(".gguf") else self.checkpoint

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus_per_replica / self.options.gpus_per_node)

    def sglang_mem_fraction_static(self) -> float:
        """SGLang: share of total GPU memory for weights plus KV cache (activations come on top)."""
        if self.kv_cache_bytes is None or self.weights_bytes is None or not self.gpu_memory_bytes:
            return round(self.gpu_memory_utilization - 0.05, 3)
        return round((self.weights_bytes + self.kv_cache_bytes) / self.gpu_memory_bytes, 3)

    def trtllm_free_gpu_memory_fraction(self) -> float:
        """TensorRT-LLM: share of the memory still free after the weights that goes to the KV cache."""
        if self.kv_cache_bytes is None or self.weights_bytes is None or not self.gpu_memory_bytes:
            return 0.9
        return round(self.kv_cache_bytes / (self.gpu_memory_bytes - self.weights_bytes), 3)


def planner_estimate(req: PlanRequest) -> tuple[dict | None, str | None]:
    """The planner's estimate as a dict, or (None, why) when the planner cannot give one."""
    try:
        from backend.planner import estimate
    except ImportError as err:
        return None, f"the planner is not available ({err})"
    try:
        return estimate(req).to_dict(), None
    except Exception as err:  # any planner failure only costs the exact memory fractions
        return None, f"the planner could not estimate this plan ({err})"


def load_spec(model: str):
    """The planner's ModelSpec, or (None, why) when the planner or the model's config is not available."""
    try:
        from backend.planner import load_model_spec

        return load_model_spec(model), None
    except Exception as err:  # unknown model, no planner yet, no network: the check is skipped
        return (
            None,
            f"could not read the model's config ({err}); the check that TP divides the heads was skipped",
        )


def check_heads(spec, tp: int) -> None:
    """ValueError when TP does not split the attention heads evenly."""
    heads, kv_heads = spec.num_attention_heads, spec.num_key_value_heads or spec.num_attention_heads
    if heads % tp:
        sizes = [n for n in (1, 2, 4, 8, 16, 32, 64) if heads % n == 0]
        raise ValueError(
            f"tensor parallel size {tp} does not divide the model's {heads} attention heads; "
            f"use a TP size in {sizes}"
        )
    if kv_heads % tp and tp % kv_heads:
        raise ValueError(
            f"tensor parallel size {tp} and the model's {kv_heads} KV heads do not divide one another; "
            f"use a TP size that divides {kv_heads} or is a multiple of it"
        )


def kv_capacity_tokens(est: dict) -> int | None:
    """Tokens of KV cache one GPU holds beside the weights, activations and overhead (None: no estimate)."""
    keys = ("gpu_memory_bytes", "weights_bytes", "activation_bytes", "overhead_bytes", "kv_bytes_per_token")
    if not all(est.get(k) is not None for k in keys) or not est["kv_bytes_per_token"]:
        return None
    free = est["gpu_memory_bytes"] - est["weights_bytes"] - est["activation_bytes"] - est["overhead_bytes"]
    return max(int(free // est["kv_bytes_per_token"]), 0)


def resolve(req: PlanRequest, options: ExportOptions) -> ExportPlan:
    """Check the request and options; ValueError names what to change."""
    req = with_scheduler_defaults(req)  # the engine's own max_num_seqs / max_num_batched_tokens where unset
    check_options(options)
    model = check_model("model", req.model)
    checkpoint = check_model("quantized checkpoint", req.checkpoint) if req.checkpoint else model
    check_revision(req.revision)
    if req.pp < 1 or req.dp < 1 or req.num_gpus < 1 or (req.tp is not None and req.tp < 1):
        raise ValueError("num_gpus, tp, pp and dp must each be at least 1")
    tp, pp = req.tensor_parallel_size, req.pp
    if tp * pp != req.num_gpus:
        raise ValueError(
            f"the plan uses {req.num_gpus} GPUs per replica but tp x pp = {tp} x {pp} = {tp * pp}; "
            f"set num_gpus to {tp * pp} or change tp/pp (dp replicas come on top)"
        )
    if not 0 < req.gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {req.gpu_memory_utilization}")
    if req.kv_cache_dtype not in KV_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_DTYPES)}, got {req.kv_cache_dtype!r}")
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        if getattr(req, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(req, name)}")
    warnings: list[str] = []
    spec, why = load_spec(req.model)
    if spec is None:
        warnings.append(why)
    else:
        check_heads(spec, tp)
    est, why = planner_estimate(req)
    if why:
        warnings.append(f"{why}; SGLang and TensorRT-LLM memory fractions use generic defaults")
    max_model_len = req.max_model_len or getattr(spec, "max_position_embeddings", None)
    if not max_model_len:
        max_model_len = req.input_len + req.output_len
        warnings.append(f"max_model_len was not given or estimated; using input + output = {max_model_len}")
    est = est or {}
    return ExportPlan(
        req=req,
        options=options,
        model=model,
        local=is_local_path(checkpoint),
        served_name=options.served_model_name or served_model_name(model),  # a local file: its name
        tp=tp,
        pp=pp,
        dp=req.dp,
        max_model_len=int(max_model_len),
        quant=quant_family(req.quant),
        gguf_type=gguf_type(req.quant) if quant_family(req.quant) == "gguf" else None,
        kv_cache_dtype=req.kv_cache_dtype,
        gpu_memory_utilization=req.gpu_memory_utilization,
        kv_cache_bytes=est.get("kv_cache_bytes"),
        weights_bytes=est.get("weights_bytes"),
        gpu_memory_bytes=est.get("gpu_memory_bytes"),
        max_num_seqs=int(req.max_num_seqs or 1),  # with_scheduler_defaults filled an unset one
        checkpoint=checkpoint,
        kv_capacity_tokens=kv_capacity_tokens(est),
        weights_format=str(est.get("quant") or ""),
        warnings=warnings,
    )
