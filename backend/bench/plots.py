"""Plotly figure of a benchmark run: the latency distribution of TTFT, TPOT, ITL and end-to-end."""

from __future__ import annotations

from backend.bench.serve import BenchResult

# Short names: four subplot titles share one row pair and must not run into each other.
TITLES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}


def latency_values_ms(result: BenchResult) -> dict[str, list[float]]:
    """Per-request (per-gap for ITL) latencies in milliseconds, successful requests only."""
    ok = [r for r in result.requests if r.success]
    return {
        "ttft": [r.ttft * 1000 for r in ok],
        "tpot": [(r.latency - r.ttft) * 1000 / (r.output_len - 1) for r in ok if r.output_len > 1],
        "itl": [gap * 1000 for r in ok for gap in r.itl],
        "e2el": [r.latency * 1000 for r in ok],
    }


def latency_figure(result: BenchResult):
    """Four box plots (one per metric, in ms) with the p50/p99 marked in each title."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    values = latency_values_ms(result)
    p = result.percentiles
    titles = [f"{TITLES[m]}: p50 {p[f'median_{m}_ms']:,.0f} / p99 {p[f'p99_{m}_ms']:,.0f} ms" for m in TITLES]
    fig = make_subplots(rows=2, cols=2, subplot_titles=titles, horizontal_spacing=0.12, vertical_spacing=0.2)
    for i, metric in enumerate(TITLES):
        fig.add_trace(
            go.Box(x=values[metric], name=metric.upper(), boxpoints="outliers", orientation="h"),
            row=i // 2 + 1,
            col=i % 2 + 1,
        )
        fig.update_xaxes(title_text="ms", row=i // 2 + 1, col=i % 2 + 1)
    fig.update_layout(
        title=f"{result.completed} requests ({result.failed} failed), "
        f"{result.output_throughput:.1f} output tok/s",
        showlegend=False,
        height=520,
    )
    return fig
