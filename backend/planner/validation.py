"""The planner against published vLLM startup logs: `python -m backend.planner.validation`.

Each run in tests/data/vllm_logs.yaml (source, vLLM version, settings, logged figures) is estimated with the
same PlanRequest fields and compared: KV cache GiB, KV tokens, weights GiB and whether vLLM started. Runs are
in one of two splits: `fit` (constants may be chosen on them) and `held_out` (never used to choose one; the
split of a new run is drawn from its id before the planner runs on it, split_for). Each run also falls into
categories (TP > 1, long context on a small GPU, large vocabulary, MoE, ...) so that a family of misses
shows. Targets (issue 33): on the held-out split, KV within 10% on at least 90% of runs, every start/refuse
verdict right, and no category's median |KV error| above 10%; on the fit split, issue 15's (KV within 5%,
or 1 GiB for pools under 20 GiB, on 90% and within 10% on all; weights within 2%).
"""

from __future__ import annotations

import hashlib
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from backend.planner.advise import estimate
from backend.planner.catalog import GIB, get_gpu
from backend.planner.request import PlanRequest
from backend.planner.sources import load_model_spec
from backend.planner.validation_report import format_report
from backend.planner.vllm_rules import custom_all_reduce, resolve_limits
from backend.planner.vllm_versions import FAMILIES

LOGS_PATH = Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm_logs.yaml"
KV_TOLERANCE, KV_TOLERANCE_ALL, WEIGHTS_TOLERANCE = 0.05, 0.10, 0.02
SMALL_POOL_GIB, SMALL_POOL_ALLOWANCE_GIB = 20.0, 1.0
KV_SHARE_TARGET = 0.90
SPLITS = ("fit", "held_out")
LONG_CONTEXT, SMALL_GPU_GIB = 65536, 48.0
# The "very large vocabularies with many sequences": the profile's sampler holds max_num_seqs x
# vocabulary logits; 50M is gpt-oss's 201k at 256 sequences, Qwen's 152k at 1024 (not at 256)
LARGE_VOCAB, MANY_LOGITS = 150_000, 50_000_000


def split_for(run_id: str) -> str:
    """The split a new run joins, fixed by its id alone: held_out where sha256(id)'s first 8 hex digits
    make an even number (about half)."""
    return "held_out" if int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16) % 2 == 0 else "fit"


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
    split: str = "fit"
    round: int | None = None  # the issue whose round added it (None: before the splits existed)

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
    non_torch_gib: float
    family: str
    categories: tuple[str, ...] = ()
    kv_error: float | None = None  # relative, signed; None where the log has no positive KV figure
    kv_error_gib: float | None = None
    weights_error: float | None = None
    notes: list[str] = field(default_factory=list)

    def kv_within(self, tolerance: float, allowance: bool = True) -> bool | None:
        """|KV error| within tolerance; with allowance, a pool under 20 GiB may also miss by up to 1 GiB."""
        if self.kv_error is None or self.kv_error_gib is None:
            return None
        small = self.run.logged["kv_cache_gib"] < SMALL_POOL_GIB
        if allowance and small and abs(self.kv_error_gib) <= SMALL_POOL_ALLOWANCE_GIB:
            return True
        return abs(self.kv_error) <= tolerance

    @property
    def verdict_right(self) -> bool:
        return self.starts == self.run.logged["starts"]


@dataclass(slots=True, frozen=True)
class Summary:
    split: str
    counted: int  # runs not excluded
    kv_compared: int
    kv_within_5: int  # plain relative error
    kv_within_10: int
    kv_within_5_allowed: int  # or within 1 GiB for pools under 20 GiB
    kv_within_10_allowed: int
    verdicts: int
    verdicts_right: int
    weights_compared: int
    weights_within_2: int
    median_kv_error: float
    category_median_errors: dict[str, float]
    category_within_10: dict[str, tuple[int, int]]  # (runs within 10%, runs compared) per category

    @property
    def worst_category(self) -> tuple[str, float] | None:
        if not self.category_median_errors:
            return None
        name = max(self.category_median_errors, key=lambda k: self.category_median_errors[k])
        return name, self.category_median_errors[name]

    @property
    def meets_targets(self) -> bool:
        verdicts_ok = self.verdicts_right == self.verdicts
        worst = self.worst_category
        categories_ok = worst is None or worst[1] <= KV_TOLERANCE_ALL
        if self.split == "held_out":
            return verdicts_ok and categories_ok and self.kv_within_10 >= KV_SHARE_TARGET * self.kv_compared
        kv_ok = (
            self.kv_within_5_allowed >= KV_SHARE_TARGET * self.kv_compared
            and self.kv_within_10_allowed == self.kv_compared
        )
        weights_ok = self.weights_within_2 == self.weights_compared
        return kv_ok and verdicts_ok and weights_ok and categories_ok


def load_runs(path: Path = LOGS_PATH) -> list[LoggedRun]:
    runs = yaml.safe_load(path.read_text())["runs"]
    keys = set(LoggedRun.__slots__)
    return [LoggedRun(**{k: v for k, v in run.items() if k in keys}) for run in runs]


def _version_dependent_defaults(run: LoggedRun, kv_gib: float) -> bool:
    """Whether the V1 release alone moves this run's KV cache by more than 10%: with the run's own
    settings, the activation peak (the scheduler defaults and the sampler path each release picks) spreads
    over more than a tenth of the KV cache across the V1 families."""
    peaks = []
    for family in FAMILIES:
        if family.is_v1:
            version = ".".join(map(str, family.since))
            peaks.append(estimate(replace(run.request(), vllm_version=version)).activation_bytes / GIB)
    return max(peaks) - min(peaks) > KV_TOLERANCE_ALL * max(kv_gib, 0.1)


def categories(run: LoggedRun, max_model_len: int, tp: int, family: str, kv_gib: float) -> tuple[str, ...]:
    """The kinds of deployment a run stands for (a run may be several)."""
    spec, gpu, req = load_model_spec(run.model), get_gpu(run.gpu), run.request()
    small = gpu.usable_bytes / GIB <= SMALL_GPU_GIB
    limits = resolve_limits(req, gpu, max_model_len)
    logits = min(limits.max_num_seqs, limits.max_num_batched_tokens) * spec.vocab_size
    found = {
        "TP > 1": tp > 1,
        "TP > 1 without NVLink": tp > 1 and not custom_all_reduce(gpu, req.disable_custom_all_reduce),
        "pipeline parallel": req.pp > 1,
        "long context on a small GPU": small and max_model_len >= LONG_CONTEXT,
        "small GPU (<= 48 GiB)": small,
        "large vocabulary x many sequences": spec.vocab_size >= LARGE_VOCAB and logits >= MANY_LOGITS,
        "MoE": bool(spec.num_experts),
        "V0 engine": "V0" in family,
        "version-dependent defaults": _version_dependent_defaults(run, kv_gib),
    }
    return tuple(name for name, hit in found.items() if hit)


def _kv_scale(run: LoggedRun, planned_kv: int) -> float:
    """The KV cache a run's sensitivity is measured against: the logged figure, else the planned one."""
    return run.logged.get("kv_cache_gib") or planned_kv / GIB


def check_run(run: LoggedRun) -> RunResult:
    est = estimate(run.request())
    terms = {t.name: t for t in est.memory_terms}
    result = RunResult(
        run=run,
        kv_gib=est.kv_cache_bytes / GIB,
        kv_tokens=est.kv_cache_tokens,
        weights_gib=est.weights_bytes / GIB,
        starts=est.fits,
        activation_gib=est.activation_bytes / GIB,
        non_torch_gib=terms["non-torch"].bytes / GIB if "non-torch" in terms else 0.0,
        family=est.vllm_family,
        categories=categories(
            run, est.max_model_len, est.tp, est.vllm_family, _kv_scale(run, est.kv_cache_bytes)
        ),
    )
    logged_kv = run.logged.get("kv_cache_gib")
    if logged_kv is not None and logged_kv > 0:
        result.kv_error_gib = result.kv_gib - logged_kv
        result.kv_error = result.kv_error_gib / logged_kv
    if run.logged.get("weights_gib"):
        result.weights_error = result.weights_gib / run.logged["weights_gib"] - 1
    return result


def _category_medians(kv: list[RunResult]) -> dict[str, float]:
    names = sorted({c for r in kv for c in r.categories})
    return {
        name: statistics.median(abs(r.kv_error or 0.0) for r in kv if name in r.categories) for name in names
    }


def _category_within(kv: list[RunResult]) -> dict[str, tuple[int, int]]:
    names = sorted({c for r in kv for c in r.categories})
    counts = {}
    for name in names:
        runs = [r for r in kv if name in r.categories]
        counts[name] = (sum(bool(r.kv_within(KV_TOLERANCE_ALL, allowance=False)) for r in runs), len(runs))
    return counts


def summarize(results: list[RunResult], split: str = "fit") -> Summary:
    counted = [r for r in results if not r.run.excluded and r.run.split == split]
    kv = [r for r in counted if r.kv_error is not None]
    kv_errors = [abs(r.kv_error) for r in kv if r.kv_error is not None]
    weights_errors = [abs(r.weights_error) for r in counted if r.weights_error is not None]
    return Summary(
        split=split,
        counted=len(counted),
        kv_compared=len(kv),
        kv_within_5=sum(bool(r.kv_within(KV_TOLERANCE, allowance=False)) for r in kv),
        kv_within_10=sum(bool(r.kv_within(KV_TOLERANCE_ALL, allowance=False)) for r in kv),
        kv_within_5_allowed=sum(bool(r.kv_within(KV_TOLERANCE)) for r in kv),
        kv_within_10_allowed=sum(bool(r.kv_within(KV_TOLERANCE_ALL)) for r in kv),
        verdicts=len(counted),
        verdicts_right=sum(r.verdict_right for r in counted),
        weights_compared=len(weights_errors),
        weights_within_2=sum(error <= WEIGHTS_TOLERANCE for error in weights_errors),
        median_kv_error=statistics.median(kv_errors) if kv_errors else 0.0,
        category_median_errors=_category_medians(kv),
        category_within_10=_category_within(kv),
    )


def main() -> int:
    results = [check_run(run) for run in load_runs()]
    summaries = [summarize(results, split) for split in SPLITS]
    print(format_report(results, summaries))
    return 0 if all(s.meets_targets for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
