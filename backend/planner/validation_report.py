"""The validation's printed report: one row per published run, then a summary per split and per category
(backend/planner/validation.py computes the figures)."""

from __future__ import annotations

from backend.planner.validation_runs import RunResult, Summary


def _cell(value: float | None, fmt: str) -> str:
    width = int("".join(ch for ch in fmt.split(".")[0] if ch.isdigit()))
    return f"{'-':>{width}}" if value is None else format(value, fmt)


def format_row(r: RunResult) -> str:
    logged = r.run.logged
    verdict = ("start" if r.starts else "refuse") + ("" if r.verdict_right else " WRONG")
    split = "excluded" if r.run.excluded else r.run.split
    return (
        f"{r.run.id:<42}{split:<9}{r.run.vllm_version:>7} {r.run.gpu:<16}"
        f"{_cell(logged.get('weights_gib'), '7.2f')}{r.weights_gib:7.2f}"
        f"{_cell(logged.get('kv_cache_gib'), '8.2f')}{r.kv_gib:8.2f}{_cell(r.kv_error, '+8.1%')}"
        f"{_cell(logged.get('activation_gib'), '7.2f')}{r.activation_gib:7.2f}"
        f"{_cell(logged.get('non_torch_gib'), '6.2f')}{r.non_torch_gib:6.2f}  {verdict:<13}"
    )


def format_table(results: list[RunResult]) -> str:
    head = (
        f"{'run':<42}{'split':<9}{'vLLM':>7} {'GPU':<16}{'w log':>7}{'w est':>7}{'KV log':>8}{'KV est':>8}"
        f"{'KV err':>8}{'act lg':>7}{'act es':>7}{'nt lg':>6}{'nt es':>6}  verdict"
    )
    lines = [head, "-" * len(head), *(format_row(r) for r in results)]
    excluded = [r for r in results if r.run.excluded]
    lines += ["", "excluded (printed, not counted):", *(f"  {r.run.id}: {r.run.excluded}" for r in excluded)]
    return "\n".join(lines)


def format_summary(s: Summary) -> str:
    worst = s.worst_category
    worst_text = f"; worst category {worst[0]} at {worst[1]:.1%}" if worst else ""
    return (
        f"{s.split}: {s.counted} runs; KV within 5% on {s.kv_within_5}/{s.kv_compared}, within 10% on "
        f"{s.kv_within_10}/{s.kv_compared} (with 1 GiB allowed under 20 GiB: {s.kv_within_5_allowed} and "
        f"{s.kv_within_10_allowed}), median |error| {s.median_kv_error:.1%}; verdicts right "
        f"{s.verdicts_right}/{s.verdicts}; weights within 2% on {s.weights_within_2}/{s.weights_compared}"
        f"{worst_text}; targets {'met' if s.meets_targets else 'NOT met'}"
    )


def format_categories(s: Summary) -> str:
    rows = [
        f"  {name:<36}{err:>8.1%}   {s.category_within_10[name][0]:>3}/{s.category_within_10[name][1]:<3}"
        for name, err in sorted(s.category_median_errors.items())
    ]
    return "\n".join([f"{s.split}: median |KV error| by category, and runs within 10%", *rows])


def format_report(results: list[RunResult], summaries: list[Summary]) -> str:
    parts = [format_table(results), ""]
    parts += [format_categories(s) for s in summaries]
    parts += ["", *(format_summary(s) for s in summaries)]
    return "\n".join(parts)
