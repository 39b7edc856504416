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
from dataclasses import replace
from pathlib import Path

import yaml

from backend.planner.advise import estimate
from backend.planner.catalog import GIB, get_gpu
from backend.planner.sources import load_model_spec
from backend.planner.validation_report import format_report
from backend.planner.validation_runs import (
    KV_TOLERANCE,
    KV_TOLERANCE_ALL,
    LARGE_VOCAB,
    LOGS_PATH,
    LONG_CONTEXT,
    MANY_LOGITS,
    SMALL_GPU_GIB,
    SPLITS,
    WEIGHTS_TOLERANCE,
    LoggedRun,
    RunResult,
    Summary,
)
from backend.planner.vllm_rules import custom_all_reduce, resolve_limits
from backend.planner.vllm_versions import FAMILIES


def split_for(run_id: str) -> str:
    """The split a new run joins, fixed by its id alone: held_out where sha256(id)'s first 8 hex digits
    make an even number (about half)."""
    return "held_out" if int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16) % 2 == 0 else "fit"


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
