"""Measured quality for the Plan tab: for a model on this machine, the quantizations the engine can run it
in, each scored against the model's own reference on the shipped text (app.py quality's run), cached as
JSON so a later visit shows the figures without running again.

What is offered depends on the checkpoint (the engine runs it; nothing is re-quantized here):
- a GGUF file: its weights as stored, and with an fp8 KV cache, against its weights dequantized to the
  engine's dtype (bf16 where the CPU is fast at it, else fp32: backend/engine/device.py decides);
- a dense folder: bf16 and fp16 weights, and an fp8 KV cache, against fp32;
- a quantized folder (GPTQ, AWQ, compressed-tensors): an fp8 KV cache against its weights as stored.
The cache key is the model's files (path, sizes, modification times), the specs, the context and the
text, so a changed checkpoint is measured afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.default_model import load_name
from backend.errors import UserError
from backend.quality.config import QualityConfig
from backend.quality.text import DEFAULT_TEXT

PLAN_CTX = 512  # llama.cpp's usual n_ctx, as app.py quality's default
CACHE_VERSION = 1  # bump when the figures' method changes
# a dense folder's offers: (the plan's name, spec options), each against the weights in fp32
DENSE_OFFERED = (("bf16", "dtype=bfloat16"), ("fp16", "dtype=float16"), ("fp8 KV", "dtype=float32,kv=fp8"))


@dataclass(slots=True)
class PlanQualityRun:
    """What a Plan measurement scores: (the plan's name for it, spec) rows against one reference."""

    model: str  # the local path
    reference: tuple[str, str]  # (name, spec)
    offered: list[tuple[str, str]] = field(default_factory=list)
    ctx: int = PLAN_CTX
    chunks: int | None = None  # None: the whole text

    def config(self) -> QualityConfig:
        specs = tuple(spec for _, spec in self.offered)
        return QualityConfig(model=specs, reference=self.reference[1], ctx=self.ctx, chunks=self.chunks)


def local_model(name: str) -> Path | None:
    """The model's path when the name (as the Plan form shows it) is a folder or .gguf on this machine."""
    path = Path(load_name(name or "")).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path.resolve()
    return path.resolve() if (path / "config.json").is_file() else None


def plan_run(name: str, ctx: int = PLAN_CTX, chunks: int | None = None) -> PlanQualityRun:
    """The run for a local model; UserError for anything else (a Hub id, a preset)."""
    run = offers(name)
    run.ctx, run.chunks = ctx, chunks
    return run


def offers(name: str) -> PlanQualityRun:
    path = local_model(name)
    if path is None:
        raise UserError(
            f"measured quality needs the model on this machine (a folder or .gguf file), got {name!r}; "
            "the Hub is not downloaded for it"
        )
    model = str(path)
    if path.suffix == ".gguf":
        return PlanQualityRun(
            model,
            ("dequantized", f"{model}@dequantized"),
            [("as stored", model), ("as stored, fp8 KV", f"{model}@kv=fp8")],
        )
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if config.get("quantization_config"):
        return PlanQualityRun(model, ("as stored", model), [("as stored, fp8 KV", f"{model}@kv=fp8")])
    return PlanQualityRun(
        model, ("fp32", f"{model}@dtype=float32"), [(n, f"{model}@{options}") for n, options in DENSE_OFFERED]
    )


def model_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.suffix in (".json", ".safetensors", ".bin", ".gguf"))


def cache_key(run: PlanQualityRun) -> str:
    path = Path(run.model)
    files = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in model_files(path)]
    text = hashlib.sha256(DEFAULT_TEXT.read_bytes()).hexdigest()
    identity = [CACHE_VERSION, files, run.reference, run.offered, run.ctx, run.chunks, text]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:24]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llm-playground" / "quality"


def cached(name: str, ctx: int = PLAN_CTX, chunks: int | None = None) -> dict[str, Any] | None:
    """The cached report (JSON as `app.py quality --out` writes it, with the offers) or None."""
    if local_model(name) is None:
        return None
    file = cache_dir() / f"{cache_key(plan_run(name, ctx, chunks))}.json"
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def measure(
    name: str, progress: Any = None, ctx: int = PLAN_CTX, chunks: int | None = None
) -> dict[str, Any]:
    """Run the measurement for a local model, cache and return its report (JSON form)."""
    from backend.quality.measure import run_quality  # torch and the engine load only when it runs

    run = plan_run(name, ctx, chunks)
    report = run_quality(run.config(), progress)
    data = report.to_dict() | {"offered": run.offered, "reference_name": run.reference[0]}
    file = cache_dir() / f"{cache_key(run)}.json"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return data


def table_markdown(data: dict[str, Any]) -> str:
    """The cached report as a Markdown table, one row per offered quantization."""
    names = dict((spec, name) for name, spec in data["offered"])
    first = data["results"][0] if data["results"] else None
    header = "| weights / KV | runs as | PPL | ln(PPL/ref) | KLD mean | KLD median | KLD p99 | same top-1 |"
    lines = [header, "|" + "---|" * 8]
    if first is not None:
        ref = data["reference"]
        lines.append(
            f"| {data['reference_name']} (reference) | {runs_as(ref)} | {first['reference_ppl']:.3f} "
            "| – | – | – | – | – |"
        )
    for info, r in zip(data["models"], data["results"], strict=True):
        lines.append(
            f"| {names.get(r['model'], r['model'])} | {runs_as(info)} | {r['ppl']:.3f} "
            f"| {r['ln_ppl_ratio']:+.4f} | {r['kld_mean']:.5f} | {r['kld_median']:.5f} "
            f"| {r['kld_p99']:.4f} | {100 * r['same_top_p']:.1f} % |"
        )
    tokens = first["num_tokens"] if first else 0
    return "\n".join(lines) + (
        f"\n\n{tokens:,} tokens of {data['text_source']} in chunks of {data['n_ctx']} "
        "(llama.cpp's `llama-perplexity --kl-divergence` method; docs/quality.md)"
    )


def runs_as(info: dict[str, Any]) -> str:
    weights = info["quantization"] or f"{info['dtype']} weights"
    kv = info["dtype"] if info["kv_cache_dtype"] == "auto" else info["kv_cache_dtype"]  # auto = dtype
    return f"{weights}, KV {kv}"


def view(name: str) -> str:
    """What Plan shows for the model: the cached figures, how to get them, or why there are none."""
    if local_model(name) is None:
        return "Measured quality needs the model on this machine (a local folder or .gguf file)."
    data = cached(name)
    if data is not None:
        return table_markdown(data)
    run = plan_run(name)
    offered = ", ".join(n for n, _ in run.offered)
    return (
        f"Not measured yet: **Measure quality** scores {offered} against {run.reference[0]} on the shipped "
        f"text (one model at a time; minutes on a CPU)."
    )
