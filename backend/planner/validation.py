"""The planner against published vLLM startup logs: `python -m backend.planner.validation`.

Each run in tests/data/vllm_logs.yaml (source, vLLM version, settings, logged figures) is estimated with the
same PlanRequest fields and compared: KV cache GiB, KV tokens, weights GiB and whether vLLM started. The
targets (issue 15): KV within 5% (or 1 GiB for pools under 20 GiB) on at least 90% of runs and within 10%
(same 1 GiB allowance) on all; every start/refuse verdict right; weights within 2%.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from backend.planner.advise import estimate
from backend.planner.catalog import GIB
from backend.planner.request import PlanRequest

LOGS_PATH = Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm_logs.yaml"
KV_TOLERANCE, KV_TOLERANCE_ALL, WEIGHTS_TOLERANCE = 0.05, 0.10, 0.02
SMALL_POOL_GIB, SMALL_POOL_ALLOWANCE_GIB = 20.0, 1.0
KV_SHARE_TARGET = 0.90


@dataclass(slots=True, frozen=True)
class LoggedRun:
    """One published vLLM startup, as tests/data/vllm_logs.yaml records it."""

    id: str
    source: str
    vllm_version: str
    gpu: str
    model: str
    settings: dict
    logged: dict
    excluded: str | None = None

    def request(self) -> PlanRequest:
        return PlanRequest(
            model=self.model, gpu=self.gpu, engine="vllm", vllm_version=self.vllm_version, **self.settings
        )


@dataclass(slots=True)
class RunResult:
    run: LoggedRun
    kv_gib: float
    kv_tokens: int
    weights_gib: float
    starts: bool
    activation_gib: float
    kv_error: float | None = None  # relative, signed; None where the log has no positive KV figure
    kv_error_gib: float | None = None
    weights_error: float | None = None
    notes: list[str] = field(default_factory=list)

    def kv_within(self, tolerance: float) -> bool | None:
        if self.kv_error is None or self.kv_error_gib is None:
            return None
        small = self.run.logged["kv_cache_gib"] < SMALL_POOL_GIB
        if small and abs(self.kv_error_gib) <= SMALL_POOL_ALLOWANCE_GIB:
            return True
        return abs(self.kv_error) <= tolerance

    @property
    def verdict_right(self) -> bool:
        return self.starts == self.run.logged["starts"]


@dataclass(slots=True, frozen=True)
class Summary:
    counted: int  # runs not excluded
    kv_compared: int
    kv_within_5: int
    kv_within_10: int
    verdicts: int
    verdicts_right: int
    weights_compared: int
    weights_within_2: int
    median_kv_error: float

    @property
    def meets_targets(self) -> bool:
        kv_ok = (
            self.kv_within_5 >= KV_SHARE_TARGET * self.kv_compared and self.kv_within_10 == self.kv_compared
        )
        verdicts_ok = self.verdicts_right == self.verdicts
        return kv_ok and verdicts_ok and self.weights_within_2 == self.weights_compared


def load_runs(path: Path = LOGS_PATH) -> list[LoggedRun]:
    runs = yaml.safe_load(path.read_text())["runs"]
    keys = set(LoggedRun.__slots__)
    return [LoggedRun(**{k: v for k, v in run.items() if k in keys}) for run in runs]


def check_run(run: LoggedRun) -> RunResult:
    est = estimate(run.request())
    result = RunResult(
        run=run,
        kv_gib=est.kv_cache_bytes / GIB,
        kv_tokens=est.kv_cache_tokens,
        weights_gib=est.weights_bytes / GIB,
        starts=est.fits,
        activation_gib=est.activation_bytes / GIB,
    )
    logged_kv = run.logged.get("kv_cache_gib")
    if logged_kv is not None and logged_kv > 0:
        result.kv_error_gib = result.kv_gib - logged_kv
        result.kv_error = result.kv_error_gib / logged_kv
    if run.logged.get("weights_gib"):
        result.weights_error = result.weights_gib / run.logged["weights_gib"] - 1
    return result


def summarize(results: list[RunResult]) -> Summary:
    counted = [r for r in results if not r.run.excluded]
    kv = [r for r in counted if r.kv_error is not None]
    kv_errors = [abs(r.kv_error) for r in kv if r.kv_error is not None]
    weights_errors = [abs(r.weights_error) for r in counted if r.weights_error is not None]
    return Summary(
        counted=len(counted),
        kv_compared=len(kv),
        kv_within_5=sum(bool(r.kv_within(KV_TOLERANCE)) for r in kv),
        kv_within_10=sum(bool(r.kv_within(KV_TOLERANCE_ALL)) for r in kv),
        verdicts=len(counted),
        verdicts_right=sum(r.verdict_right for r in counted),
        weights_compared=len(weights_errors),
        weights_within_2=sum(error <= WEIGHTS_TOLERANCE for error in weights_errors),
        median_kv_error=statistics.median(kv_errors) if kv_errors else 0.0,
    )


def _cell(value: float | None, fmt: str) -> str:
    width = int("".join(ch for ch in fmt.split(".")[0] if ch.isdigit()))
    return f"{'-':>{width}}" if value is None else format(value, fmt)


def format_row(r: RunResult) -> str:
    logged = r.run.logged
    verdict = ("start" if r.starts else "refuse") + ("" if r.verdict_right else " WRONG")
    flag = "excluded" if r.run.excluded else ""
    return (
        f"{r.run.id:<32}{r.run.vllm_version:>8} {r.run.gpu:<10}"
        f"{_cell(logged.get('weights_gib'), '8.2f')}{r.weights_gib:8.2f}{_cell(r.weights_error, '+8.1%')}"
        f"{_cell(logged.get('kv_cache_gib'), '8.2f')}{r.kv_gib:8.2f}{_cell(r.kv_error, '+8.1%')}"
        f"{_cell(logged.get('activation_gib'), '7.2f')}{r.activation_gib:7.2f}  {verdict:<13}{flag}"
    )


def format_table(results: list[RunResult]) -> str:
    head = (
        f"{'run':<32}{'vLLM':>8} {'GPU':<10}{'w log':>8}{'w est':>8}{'w err':>8}"
        f"{'KV log':>8}{'KV est':>8}{'KV err':>8}{'act lg':>7}{'act es':>7}  verdict"
    )
    lines = [head, "-" * len(head), *(format_row(r) for r in results)]
    excluded = [r for r in results if r.run.excluded]
    lines += ["", "excluded (printed, not counted):", *(f"  {r.run.id}: {r.run.excluded}" for r in excluded)]
    return "\n".join(lines)


def format_summary(s: Summary) -> str:
    return (
        f"{s.counted} runs counted: KV cache within 5% (or 1 GiB under 20 GiB) on "
        f"{s.kv_within_5}/{s.kv_compared}, "
        f"within 10% on {s.kv_within_10}/{s.kv_compared}, median |error| {s.median_kv_error:.1%}; "
        f"start/refuse verdicts right {s.verdicts_right}/{s.verdicts}; weights within 2% on "
        f"{s.weights_within_2}/{s.weights_compared}; targets {'met' if s.meets_targets else 'NOT met'}"
    )


def main() -> int:
    results = [check_run(run) for run in load_runs()]
    summary = summarize(results)
    print(format_table(results))
    print()
    print(format_summary(summary))
    return 0 if summary.meets_targets else 1


if __name__ == "__main__":
    sys.exit(main())
