"""Benchmark results: per-request timings, the vLLM-style summary, its JSON and its printed table."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)


@dataclass(slots=True)
class RequestResult:
    success: bool = False
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str = ""


@dataclass(slots=True)
class BenchResult:
    config: dict
    duration: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    percentiles: dict[str, float]  # mean_ttft_ms, median_ttft_ms, std_ttft_ms, p90_ttft_ms, p99_ttft_ms, ...
    requests: list[RequestResult]

    def to_dict(self) -> dict:
        """vLLM's JSON layout: summary keys, flattened percentiles, then per-request lists."""
        out = {
            k: getattr(self, k)
            for k in (
                "duration",
                "completed",
                "failed",
                "total_input_tokens",
                "total_output_tokens",
                "request_throughput",
                "output_throughput",
                "total_token_throughput",
            )
        }
        out.update(self.percentiles)
        ok = [r for r in self.requests if r.success]
        out.update(
            input_lens=[r.prompt_len for r in ok],
            output_lens=[r.output_len for r in ok],
            ttfts=[r.ttft for r in ok],
            itls=[r.itl for r in ok],
            e2els=[r.latency for r in ok],
            errors=[r.error for r in self.requests if not r.success],
            config=self.config,
        )
        return out


def summarize(results: list[RequestResult], duration: float) -> tuple[dict, dict[str, float]]:
    ok = [r for r in results if r.success]
    inp, out = sum(r.prompt_len for r in ok), sum(r.output_len for r in ok)
    totals = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": inp,
        "total_output_tokens": out,
        "request_throughput": len(ok) / duration,
        "output_throughput": out / duration,
        "total_token_throughput": (inp + out) / duration,
    }
    series = {
        "ttft": [r.ttft for r in ok],
        "tpot": [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1],
        "itl": [gap for r in ok for gap in r.itl],
        "e2el": [r.latency for r in ok],
    }
    stats = {}
    for name in METRICS:
        values_ms = [v * 1000 for v in series[name]] or [0.0]
        stats[f"mean_{name}_ms"] = statistics.fmean(values_ms)
        stats[f"median_{name}_ms"] = statistics.median(values_ms)
        stats[f"std_{name}_ms"] = statistics.pstdev(values_ms)
        for p in PERCENTILES[1:]:
            stats[f"p{p}_{name}_ms"] = percentile(values_ms, p)
    return totals, stats


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * p / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def format_result(result: BenchResult) -> str:
    """The summary table `vllm bench serve` prints."""
    lines = ["{s:{c}^60}".format(s=" Serving Benchmark Result ", c="=")]
    rows = [
        ("Successful requests:", result.completed),
        ("Failed requests:", result.failed),
        ("Benchmark duration (s):", f"{result.duration:.2f}"),
        ("Total input tokens:", result.total_input_tokens),
        ("Total generated tokens:", result.total_output_tokens),
        ("Request throughput (req/s):", f"{result.request_throughput:.2f}"),
        ("Output token throughput (tok/s):", f"{result.output_throughput:.2f}"),
        ("Total token throughput (tok/s):", f"{result.total_token_throughput:.2f}"),
    ]
    titles = {
        "ttft": "Time to First Token",
        "tpot": "Time per Output Token (excl. 1st token)",
        "itl": "Inter-token Latency",
        "e2el": "End-to-end Latency",
    }
    lines += [f"{k:<44}{v:>16}" for k, v in rows]
    for name in METRICS:
        lines.append("{s:{c}^60}".format(s=f" {titles[name]} ", c="-"))
        for stat in ("mean", "median", "p90", "p99"):
            label = (
                f"{stat.capitalize() if stat in ('mean', 'median') else stat.upper()} {name.upper()} (ms):"
            )
            lines.append(f"{label:<44}{result.percentiles[f'{stat}_{name}_ms']:>16.2f}")
    lines.append("=" * 60)
    return "\n".join(lines)
