"""A comparison as a table, overlaid plotly charts (one trace per target) and a standalone HTML report."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING

from backend.bench.compare import CompareRow, Comparison, OfflineRun, TargetRun
from backend.bench.plots import latency_values_ms

if TYPE_CHECKING:
    from backend.quality.statistics import QualityResult

GIB = 1024**3
# (header, row -> text)
COLUMNS = (
    ("target", lambda r: r.target),
    ("engine", lambda r: r.engine),
    ("output tok/s", lambda r: f"{r.output_tok_s:,.1f}"),
    ("total tok/s", lambda r: f"{r.total_tok_s:,.1f}"),
    ("TTFT p50/p99 ms", lambda r: f"{r.ttft_p50_ms:,.0f} / {r.ttft_p99_ms:,.0f}"),
    ("TPOT p50/p99 ms", lambda r: f"{r.tpot_p50_ms:,.1f} / {r.tpot_p99_ms:,.1f}"),
    ("ITL p50/p99 ms", lambda r: f"{r.itl_p50_ms:,.1f} / {r.itl_p99_ms:,.1f}"),
    ("done/failed", lambda r: f"{r.completed}/{r.failed}"),
    ("prefix-cache hits", lambda r: _count(r.prefix_cache_hits)),
    ("peak RSS", lambda r: "–" if r.peak_rss_bytes is None else f"{r.peak_rss_bytes / GIB:.2f} GiB"),
    ("KV tokens", lambda r: _count(r.kv_cache_tokens)),
    ("plan: weights", lambda r: _gib(r.planned_weights_bytes)),
    (
        "plan: KV tokens",
        lambda r: "–" if r.planned_kv_cache_tokens is None else f"{r.planned_kv_cache_tokens:,}",
    ),
    ("PPL", lambda r: "–" if r.quality is None else f"{r.quality.ppl:.3f}"),
    ("ln(PPL/ref)", lambda r: "–" if r.quality is None else f"{r.quality.ln_ppl_ratio:+.4f}"),
    ("KLD mean / p99", lambda r: _kld(r.quality)),
    ("same top-1", lambda r: "–" if r.quality is None else f"{100 * r.quality.same_top_p:.1f} %"),
)


def _kld(result: QualityResult | None) -> str:
    """Mean and 99th-percentile KL; '≥' marks a lower bound (a server's top 20), 'n/a' none (a server
    reference)."""
    if result is None or result.kld_mean is None or result.kld_p99 is None:
        return "–" if result is None else "n/a"
    bound = "≥ " if result.kld_kind == "lower bound" else ""
    return f"{bound}{result.kld_mean:.4f} / {bound}{result.kld_p99:.4f}"


def _count(n: int | None, missing: str = "–") -> str:
    return missing if n is None else f"{n:,}"


def _gib(nbytes: float | None) -> str:
    return "–" if nbytes is None else f"{nbytes / GIB:.2f} GiB"


def table_rows(rows: list[CompareRow]) -> tuple[list[str], list[list[str]]]:
    return [h for h, _ in COLUMNS], [[cell(r) for _, cell in COLUMNS] for r in rows]


def format_table(rows: list[CompareRow]) -> str:
    """A Markdown table (prints readably in a terminal and pastes into a README)."""
    headers, body = table_rows(rows)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


# issue 19's bars: served output tok/s >= 1.3x vLLM's, median TPOT below vLLM's, p99 TTFT below 2 s,
# served throughput >= 80% of the offline engine's on the same prompts
SPEED_BAR, TTFT_BAR_MS, OFFLINE_BAR = 1.3, 2000.0, 0.8
TTFT_BAR_CONCURRENCY = 16  # the p99 TTFT bar is set at this concurrency only


def _verdict(is_met: bool) -> str:
    return "met" if is_met else "NOT met"


def peer_lines(ours: CompareRow, peer: CompareRow) -> list[str]:
    c, ratio = ours.max_concurrency, ours.output_tok_s / peer.output_tok_s if peer.output_tok_s else 0.0
    return [
        f"c={c}: output tok/s {ours.engine} / {peer.engine} = {ours.output_tok_s:,.1f} / "
        f"{peer.output_tok_s:,.1f} = {ratio:.2f}x (bar >= {SPEED_BAR}x: {_verdict(ratio >= SPEED_BAR)})",
        f"c={c}: median TPOT {ours.tpot_p50_ms:,.1f} ms vs {peer.tpot_p50_ms:,.1f} ms "
        f"(bar: below {peer.engine}'s: {_verdict(ours.tpot_p50_ms < peer.tpot_p50_ms)})",
    ]


def offline_line(served: TargetRun, offline: OfflineRun) -> str:
    row = served.row
    if not offline.output_tok_s:
        return f"c={row.max_concurrency}: offline engine {offline.detail}"
    share = row.output_tok_s / offline.output_tok_s
    line = (
        f"c={row.max_concurrency}: served / offline output tok/s = {row.output_tok_s:,.1f} / "
        f"{offline.output_tok_s:,.1f} = {share:.2f} (bar >= {OFFLINE_BAR}: {_verdict(share >= OFFLINE_BAR)})"
    )
    served_tokens = served.result.total_input_tokens
    if offline.prompt_tokens != served_tokens:  # the server tokenized the prompts differently
        line += f"; prompts DIFFER: {served_tokens:,} prompt tokens served, {offline.prompt_tokens:,} offline"
    return line


def bar_lines(comparison: Comparison, ours: str = "embedded", peer: str = "vllm") -> list[str]:
    """The issue's bars as lines, per concurrency: ours against the peer, served against offline."""
    lines = []
    offline = {run.max_concurrency: run for run in comparison.offline}
    for served in comparison.runs:
        row = served.row
        if row.engine != ours:
            continue
        c = row.max_concurrency
        other = next((r for r in comparison.rows() if r.engine == peer and r.max_concurrency == c), None)
        lines += peer_lines(row, other) if other else []
        if c == TTFT_BAR_CONCURRENCY:
            met = _verdict(row.ttft_p99_ms < TTFT_BAR_MS)
            lines.append(f"c={c}: p99 TTFT {row.ttft_p99_ms:,.0f} ms (bar < {TTFT_BAR_MS:,.0f} ms: {met})")
        if c in offline:
            lines.append(offline_line(served, offline[c]))
    return lines


def fairness_line(comparison: Comparison) -> str:
    """What kept the targets' prefix caches apart, with the figures that show it: each target's salt, each
    run's prompt tokens (equal when the prompts are) and the prefix-cache hits its server counted during
    it; "" when the runs had no salts."""
    runs = comparison.runs
    salts = {run.row.target.split(" c=")[0]: run.row.prompt_salt.strip() for run in runs}
    if not any(salts.values()):
        return ""
    named = ", ".join(f"{target} {salt!r}" for target, salt in salts.items())
    tokens = ", ".join(f"{run.row.target} {run.result.total_input_tokens:,}" for run in runs)
    hits = ", ".join(f"{run.row.target} {_count(run.row.prefix_cache_hits, 'not exported')}" for run in runs)
    return (
        f"prefix cache: each target's prompts began with a salt of its own ({named}), so no run was served "
        f"from a cache an earlier one filled; prompt tokens: {tokens}; prefix-cache hits during each run "
        f"(tokens, from /metrics): {hits}."
    )


def quality_lines(comparison: Comparison) -> list[str]:
    """What the quality columns measured, against which reference, and the targets without figures."""
    ref = comparison.quality_reference
    if ref is None:
        return []
    lines = [
        f"quality: {ref.num_tokens:,} tokens of the shipped quality text (backend/quality/data) scored "
        f"against {ref.model}, PPL {ref.ppl:.3f}; a server's KL, from its top-20 prompt logprobs, is a "
        "lower bound (≥)."
    ]
    notes = {r.target.split(" c=")[0]: r.quality_note for r in comparison.rows() if r.quality_note}
    return lines + [f"quality of {target}: none ({note})" for target, note in notes.items()]


def note_lines(comparison: Comparison) -> list[str]:
    """How each target ran (vLLM's mode and threads), how the prompts were kept apart, how the offline
    column and the quality columns were taken."""
    notes = dict.fromkeys(f"{r.target.split(' c=')[0]}: {r.detail}" for r in comparison.rows() if r.detail)
    offline = [f"offline c={r.max_concurrency}: {r.detail}" for r in comparison.offline]
    return [*notes, *filter(None, [fairness_line(comparison)]), *offline, *quality_lines(comparison)]


def table_html(rows: list[CompareRow]) -> str:
    headers, body = table_rows(rows)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    cells = "".join(
        f"<tr data-target='{html.escape(r.target)}'>"
        + "".join(f"<td>{html.escape(c)}</td>" for c in row)
        + "</tr>"
        for r, row in zip(rows, body, strict=True)
    )
    table = f"<table class='compare-table' id='compare-table'><tr>{head}</tr>{cells}</table>"
    return f"<div style='overflow-x:auto'>{table}</div>"


def over_time_figure(comparison: Comparison, key: str, title: str, scale: float = 1.0, unit: str = ""):
    import plotly.graph_objects as go

    fig = go.Figure()
    for run in comparison.runs:
        points = [(s["t"], s[key] * scale) for s in run.samples if s.get(key) is not None]
        fig.add_trace(go.Scatter(x=[t for t, _ in points], y=[v for _, v in points], name=run.row.target))
    fig.update_layout(title=title, xaxis_title="seconds since the run started", yaxis_title=unit, height=340)
    return fig


def latency_figure(comparison: Comparison):
    """TTFT, TPOT and ITL distributions, one box per target in each."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    metrics = ("ttft", "tpot", "itl")
    fig = make_subplots(rows=1, cols=3, subplot_titles=[f"{m.upper()} (ms)" for m in metrics])
    for i, run in enumerate(comparison.runs):
        values = latency_values_ms(run.result)
        for col, metric in enumerate(metrics, start=1):
            fig.add_trace(
                go.Box(
                    y=values[metric],
                    name=run.row.target,
                    legendgroup=run.row.target,
                    showlegend=col == 1,
                    marker_color=f"hsl({i * 137 % 360},60%,45%)",
                    boxpoints=False,
                ),
                row=1,
                col=col,
            )
    fig.update_layout(title="Latency distributions", height=380)
    # the legend names the targets: long URLs under three narrow panels ran into each other
    fig.update_xaxes(showticklabels=False)
    return fig


def figures(comparison: Comparison) -> dict:
    return {
        "throughput": over_time_figure(
            comparison, "generation_tokens_per_s", "Generation throughput (from /metrics)", unit="tok/s"
        ),
        "latency": latency_figure(comparison),
        "kv": over_time_figure(comparison, "kv_cache_usage", "KV-cache usage (from /metrics)", 100.0, "%"),
    }


def write_report(comparison: Comparison, out: str | Path) -> dict[str, Path]:
    """compare.json and compare.html (plotly.js inline: opens offline) in the folder `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out / "compare.json", out / "compare.html"
    json_path.write_text(json.dumps(comparison.to_dict(), indent=1), encoding="utf-8")
    w = comparison.workload
    parts = [
        "<html><head><meta charset='utf-8'><title>Engine comparison</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:24px}"
        "td,th{border:1px solid #ddd;padding:4px 8px}"
        "table{border-collapse:collapse}</style></head><body>",
        "<h1>Engine comparison</h1>",
        f"<p>Workload: dataset <b>{html.escape(w.dataset)}</b>, {w.num_prompts} prompts per run, output up "
        f"to {w.output_len} tokens, seed {w.seed} (each concurrency its own slice of the seed's prompts); "
        "targets run one after the other.</p>",
        table_html(comparison.rows()),
        *(f"<p>{html.escape(line)}</p>" for line in [*bar_lines(comparison), *note_lines(comparison)]),
    ]
    for i, fig in enumerate(figures(comparison).values()):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=i == 0))
    parts.append("</body></html>")
    html_path.write_text("\n".join(parts), encoding="utf-8")
    return {"json": json_path, "html": html_path}
