"""Plotly figure builders. Pure functions: data in, figure out; every axis labelled with its unit."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from backend.server.expert_load import ExpertLoad

GIB = 1024**3
MEMORY_PARTS = (  # (Estimate key, legend label, colour)
    ("weights_bytes", "Weights", "#4f46e5"),
    ("kv_cache_bytes", "KV cache", "#0ea5e9"),
    ("activation_bytes", "Activations", "#f59e0b"),
    ("cuda_graph_bytes", "CUDA graphs (CPU: captured decode step)", "#a78bfa"),
    ("overhead_bytes", "Overhead (CUDA context)", "#94a3b8"),
)
_LAYOUT = dict(template="plotly_white", margin=dict(l=50, r=20, t=40, b=40), font=dict(size=12))


def _figure(title: str, height: int = 320) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, height=height, **_LAYOUT)
    return fig


def memory_figure(estimate: dict[str, Any], gpu: str) -> go.Figure:
    """Stacked bar of memory per GPU (weights, KV cache, activations, overhead) against capacity and
    against the share that gpu_memory_utilization allows."""
    fig = _figure(f"Memory per GPU ({gpu})", height=340)
    for key, label, colour in MEMORY_PARTS:
        gib = (estimate.get(key) or 0) / GIB
        fig.add_bar(
            x=[gib],
            y=[gpu],
            name=label,
            orientation="h",
            marker_color=colour,
            hovertemplate=f"{label}: %{{x:.2f}} GiB<extra></extra>",
        )
    capacity = estimate["gpu_memory_bytes"] / GIB
    budget = capacity * estimate["gpu_memory_utilization"]
    fig.add_vline(
        x=capacity,
        line_color="#dc2626",
        annotation_text=f"GPU {capacity:.0f} GiB",
        annotation_position="top right",
    )
    fig.add_vline(
        x=budget,
        line_dash="dash",
        line_color="#f97316",
        annotation_text=f"budget {budget:.1f} GiB",
        annotation_position="top left",  # beside the capacity's label, clear of the bar
    )
    # the legend (up to three rows of long names) at the bottom of the figure, under the axis title
    fig.update_layout(barmode="stack", legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"))
    fig.update_layout(margin=dict(l=50, r=20, t=40, b=130))
    fig.update_xaxes(title="GiB per GPU", rangemode="tozero")
    return fig


FIT_COLOURS = {True: ("fits", "#4f46e5"), False: ("does not fit", "#f87171")}
ROW_PX = 26  # each GPU's row: its name at 12 px stays clear of the next one


def gpu_compare_figure(rows: Sequence[dict[str, Any]]) -> go.Figure:
    """Every GPU on its own row, cheapest that fits at the top: its decode throughput and its cost per 1M
    output tokens side by side (bars, each with its value), coloured by whether the plan fits."""
    ordered = sorted(rows, key=lambda r: (not r["fits"], r["cost_per_million_output_tokens"]))
    names = [gpu_row_name(r) for r in ordered]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.08)
    for fits, (label, colour) in FIT_COLOURS.items():
        part = [(name, r) for name, r in zip(names, ordered, strict=True) if bool(r["fits"]) == fits]
        if not part:
            continue
        for col, key, text, unit in (
            (1, "decode_tokens_per_s_total", "%{x:,.0f}", "tok/s"),
            (2, "cost_per_million_output_tokens", "$%{x:.3g}", "/ 1M tok"),
        ):
            fig.add_bar(
                x=[r[key] for _, r in part],
                y=[name for name, _ in part],
                orientation="h",
                name=label,
                legendgroup=label,
                showlegend=col == 1,
                marker_color=colour,
                texttemplate=text,
                textposition="outside",
                cliponaxis=False,
                hovertemplate=f"%{{y}}: {text} {unit}<extra>{label}</extra>",
                row=1,
                col=col,
            )
    fig.update_yaxes(categoryorder="array", categoryarray=names, autorange="reversed", automargin=True)
    fig.update_xaxes(title_text="decode throughput, all requests (tok/s)", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="cost ($ / 1M output tok, log scale)", type="log", dtick=1, row=1, col=2)
    fig.update_layout(
        title="GPUs compared: throughput and cost (same model and workload)",
        height=120 + ROW_PX * len(names),
        legend=dict(orientation="h", y=1.0, yanchor="bottom", x=1.0, xanchor="right"),
        **_LAYOUT,
    )
    fig.update_layout(margin=dict(l=50, r=40, t=70, b=50))
    return fig


def gpu_row_name(row: dict[str, Any]) -> str:
    """A GPU's row label: its name, with the count when the plan uses more than one."""
    return row["gpu"] if row["num_gpus"] == 1 else f"{row['num_gpus']} × {row['gpu']}"


LIVE_SERIES = (  # (row, col, sample key, label, scale)
    (1, 1, "generation_tokens_per_s", "generation tok/s", 1.0),
    (1, 1, "prompt_tokens_per_s", "prompt tok/s", 1.0),
    (1, 2, "kv_cache_usage", "KV cache usage %", 100.0),
    (2, 1, "num_requests_running", "running", 1.0),
    (2, 1, "num_requests_waiting", "waiting", 1.0),
    (2, 2, "prefix_cache_hit_rate", "prefix-cache hit %", 100.0),
    (2, 2, "num_preemptions_total", "preemptions (total)", 1.0),
    (2, 2, "spec_decode_acceptance_rate", "draft acceptance %", 100.0),
    (2, 2, "spec_decode_mean_acceptance_length", "tokens per verification", 1.0),
)


def live_figure(samples: Sequence[dict[str, Any]], title: str = "Live engine metrics") -> go.Figure:
    """Four panels over time: tokens/s, KV-cache usage, running/waiting, prefix hits and preemptions."""
    fig = make_subplots(
        rows=2,
        cols=2,
        vertical_spacing=0.22,
        horizontal_spacing=0.14,
        subplot_titles=(
            "Throughput (tok/s)",
            "KV-cache usage (%)",
            "Requests",
            "Prefix hits, preemptions, drafts",
        ),
    )
    now = samples[-1]["timestamp"] if samples else 0.0
    seconds = [s["timestamp"] - now for s in samples]
    for row, col, key, label, scale in LIVE_SERIES:
        values = [None if s.get(key) is None else s[key] * scale for s in samples]
        fig.add_scatter(x=seconds, y=values, name=label, mode="lines", row=row, col=col)
    fig.update_yaxes(title_text="tok/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="% of KV blocks", range=[0, kv_axis_top(samples)], row=1, col=2)
    fig.update_yaxes(title_text="requests", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="% / count", rangemode="tozero", row=2, col=2)
    fig.update_xaxes(range=[min(-60.0, seconds[0] if seconds else 0.0), 0])
    fig.update_xaxes(title_text="seconds (0 = now)", row=2)
    fig.update_layout(title=title, height=540, legend=dict(orientation="h", y=-0.22), **_LAYOUT)
    fig.update_layout(uirevision="live")  # keep hidden series across refreshes
    return fig


def kv_axis_top(samples: Sequence[dict[str, Any]]) -> float:
    """The KV-usage panel's top, in %: 100 once usage is high, else a step of 10 above the peak, so that
    a few chats on a large pool (a few % of the blocks) still show as a curve rather than a flat line."""
    peak = max((s["kv_cache_usage"] * 100 for s in samples if s.get("kv_cache_usage") is not None), default=0)
    return min(100.0, max(10.0, 10.0 * math.ceil(peak * 1.25 / 10)))


def kv_block_map_figure(
    block_owners: dict[str, list[int]],
    num_blocks: int,
    columns: int = 64,
    shared_blocks: dict[int, int] | None = None,
) -> go.Figure:
    """Every KV block as a cell, coloured by the request that holds it (grey = free); a block held by
    several sequences (shared_blocks: block -> how many; a prompt shared by parallel samples or a
    prefix-cache hit) carries a dark diamond."""
    rows = max(1, -(-num_blocks // columns))
    shared = {block: count for block, count in (shared_blocks or {}).items() if 0 <= block < num_blocks}
    owner_index: list[list[int | None]] = [[None] * columns for _ in range(rows)]
    labels = [["free"] * columns for _ in range(rows)]
    for index, (request_id, blocks) in enumerate(sorted(block_owners.items()), start=1):
        for block in blocks:
            if 0 <= block < num_blocks:
                owner_index[block // columns][block % columns] = index
                labels[block // columns][block % columns] = request_id
    title = f"KV blocks by request ({num_blocks} blocks, grey = free"
    title += ", ◆ = shared by several sequences)" if shared else ")"
    fig = _figure(title, height=max(160, 60 + 14 * rows))
    fig.add_heatmap(
        z=owner_index,
        text=labels,
        showscale=False,
        xgap=1,
        ygap=1,
        colorscale="Turbo",
        zmin=1,
        zmax=max(1, len(block_owners)),
        hovertemplate="block %{customdata}<br>%{text}<extra></extra>",
        customdata=[[r * columns + c for c in range(columns)] for r in range(rows)],
        hoverongaps=False,
    )
    if shared:
        fig.add_scatter(
            x=[block % columns for block in shared],
            y=[block // columns for block in shared],
            mode="markers",
            marker=dict(symbol="diamond", size=7, color="#111827"),
            name="shared",
            showlegend=False,
            text=[f"block {block}<br>shared by {count} sequences" for block, count in shared.items()],
            hovertemplate="%{text}<extra></extra>",
        )
    fig.update_layout(plot_bgcolor="#e5e7eb")  # free blocks (None) show the background
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, autorange="reversed")
    return fig


def expert_load_figure(load: ExpertLoad) -> go.Figure:
    """MoE layers x experts, each cell the tokens routed to that expert in the load's window
    (backend.server.expert_load computes the matrix); hover adds the share of the layer's tokens."""
    layers = len(load.tokens)
    experts = max((len(row) for row in load.tokens), default=0)
    title = f"Tokens routed per expert, last {load.seconds:.0f} s ({load.total:,} token→expert assignments)"
    fig = _figure(title, height=max(200, 90 + 18 * layers))
    fig.add_heatmap(
        z=load.tokens,
        x=list(range(experts)),
        y=[f"MoE layer {i}" for i in range(layers)],
        customdata=load.shares(),
        colorscale="Viridis",
        zmin=0,
        colorbar=dict(title="tokens"),
        hovertemplate="%{y}, expert %{x}: %{z} tokens (%{customdata:.0%} of the layer)<extra></extra>",
        xgap=1,
        ygap=1,
    )
    fig.update_xaxes(title="expert", dtick=max(1, experts // 16))
    fig.update_yaxes(autorange="reversed")
    return fig
