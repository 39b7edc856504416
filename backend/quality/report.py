"""A quality report as a Markdown table (terminal, docs) and JSON (`--out`)."""

from __future__ import annotations

import json
from pathlib import Path

from backend.quality.measure import ModelInfo, QualityReport
from backend.quality.statistics import QualityResult

GIB = 1024**3


def kld_text(value: float | None, kind: str, digits: int = 6) -> str:
    """A KL figure, marked '>=' when it is a lower bound (a server's top-k), 'n/a' without one."""
    if value is None:
        return "n/a"
    return f"{'≥ ' if kind == 'lower bound' else ''}{value:.{digits}f}"


def result_cells(result: QualityResult) -> list[str]:
    r = result
    return [
        f"{r.ppl:.4f} ± {r.ppl_uncertainty:.4f}",
        f"{r.ln_ppl_ratio:+.5f} ± {r.ln_ppl_ratio_uncertainty:.5f}",
        f"{kld_text(r.kld_mean, r.kld_kind)} ± {r.kld_mean_uncertainty or 0:.6f}"
        if r.kld_mean is not None
        else "n/a",
        kld_text(r.kld_median, r.kld_kind),
        kld_text(r.kld_p99, r.kld_kind),
        f"{100 * r.rms_delta_p:.3f} %",
        f"{100 * r.same_top_p:.2f} ± {100 * r.same_top_p_uncertainty:.2f} %",
    ]


HEADERS = ["model", "how it ran", "PPL", "ln(PPL/PPL ref)", "mean KLD", "median KLD", "99% KLD", "RMS Δp",
           "same top-1"]  # fmt: skip


def how_it_ran(info: ModelInfo) -> str:
    weights = info.quantization or f"{info.dtype} weights"
    kv = info.dtype if info.kv_cache_dtype == "auto" else info.kv_cache_dtype  # auto = the dtype
    return f"{weights}; KV {kv}; {info.weights_bytes / GIB:.3f} GiB"


def format_table(report: QualityReport) -> str:
    ref = report.reference
    ref_ppl = report.results[0] if report.results else None
    lines = [
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    if ref_ppl is not None:
        base = f"{ref_ppl.reference_ppl:.4f} ± {ref_ppl.reference_ppl_uncertainty:.4f}"
        lines.append(f"| {ref.label} (reference) | {how_it_ran(ref)} | {base} | – | – | – | – | – | – |")
    for info, result in zip(report.models, report.results, strict=True):
        lines.append("| " + " | ".join([info.label, how_it_ran(info), *result_cells(result)]) + " |")
    return "\n".join(lines)


def summary_line(report: QualityReport) -> str:
    return (
        f"{report.num_chunks} chunks of {report.n_ctx} tokens ({report.tokens_per_chunk} scored each, "
        f"{report.num_chunks * report.tokens_per_chunk} in all) of {report.text_source} "
        f"({report.num_text_tokens} tokens); KL(reference || model) over the whole vocabulary"
    )


def write_json(report: QualityReport, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=1), encoding="utf-8")
    return path
