"""Checks on a PlanRequest against a model, and what its quantization name resolves to."""

from __future__ import annotations

from backend.planner.catalog import Quantization, get_quantization
from backend.planner.request import ENGINES, PlanRequest
from backend.planner.specs import ModelSpec


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def validate_request(req: PlanRequest, spec: ModelSpec) -> tuple[int, int]:
    """(tp, max_model_len) after checking every field; ValueError names the allowed values or range."""
    _check(req.engine in ENGINES, f"unknown engine {req.engine!r}; choose one of: {', '.join(ENGINES)}")
    for name in ("num_gpus", "pp", "input_len", "output_len", "concurrency", "max_num_seqs", "block_size"):
        value = getattr(req, name)
        _check(isinstance(value, int) and value >= 1, f"{name} must be an integer >= 1, got {value!r}")
    _check(
        isinstance(req.max_num_batched_tokens, int) and req.max_num_batched_tokens >= 1,
        f"max_num_batched_tokens must be an integer >= 1, got {req.max_num_batched_tokens!r}",
    )
    util = req.gpu_memory_utilization
    _check(
        isinstance(util, int | float) and 0 < util <= 1,
        f"gpu_memory_utilization must be in (0, 1], got {util!r}",
    )
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
