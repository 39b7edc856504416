"""A comparison as a table, overlaid plotly charts (one trace per target) and a standalone HTML report."""

from __future__ import annotations

import html
import json
from pathlib import Path

from backend.bench.compare import CompareRow, Comparison
from backend.bench.plots import latency_values_ms

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
    ("peak RSS", lambda r: "–" if r.peak_rss_bytes is None else f"{r.peak_rss_bytes / GIB:.2f} GiB"),
    ("KV tokens", lambda r: _count(r.kv_cache_tokens)),
    ("plan: weights", lambda r: _gib(r.planned_weights_bytes)),
    (
        "plan: KV tokens",
        lambda r: "–" if r.planned_kv_cache_tokens is None else f"{r.planned_kv_cache_tokens:,}",
    ),
)


def _count(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"


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
        f"<p>Workload: dataset <b>{html.escape(w.dataset)}</b>, {w.num_prompts} prompts, max concurrency "
        f"{w.max_concurrency}, output up to {w.output_len} tokens, seed {w.seed}; targets run one after the "
        "other.</p>",
        table_html(comparison.rows()),
    ]
    for i, fig in enumerate(figures(comparison).values()):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=i == 0))
    parts.append("</body></html>")
    html_path.write_text("\n".join(parts), encoding="utf-8")
    return {"json": json_path, "html": html_path}
