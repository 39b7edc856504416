"""The recommendation: the cheapest (GPU, count) that fits the workload and meets optional latency /
throughput targets, in the plan's own quantization (the one the Plan tab's chart shows; auto = as
stored), unless another quantization is strictly cheaper or the plan's meets the targets on no GPU.

Invariant: a recommendation in the plan's quantization is the chart's estimate for that GPU and count
(the same request with only gpu, num_gpus and tp changed), so its throughput and cost are the chart's.
Another quantization is never one with more bits than the plan's: dequantizing stored weights (a Q4_1
GGUF served as bf16) costs memory and buys no quality.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.engines import CPU_ENGINES  # engines that also run on a CPU-only host
from backend.planner.advise import tp_options, try_estimate
from backend.planner.catalog import get_quantization, list_gpus
from backend.planner.estimate import Estimate
from backend.planner.request import PlanRequest, resolve_quant
from backend.planner.sources import load_model_spec
from backend.planner.specs import ModelSpec

# Quantizations the recommendation tries besides the plan's, from best quality down; each engine keeps
# those it loads.
RECOMMEND_QUANTS = ("bf16", "fp8", "int8-w8a8", "awq-int4", "gguf-q8_0", "gguf-q4_k_m")


@dataclass(slots=True, frozen=True)
class Targets:
    """Optional latency / throughput targets (None: no target)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    tokens_per_s: float | None = None

    def are_met(self, est: Estimate, req: PlanRequest) -> bool:
        if not est.fits or est.max_concurrency < req.concurrency:
            return False
        if self.ttft_s is not None and (est.ttft_s is None or est.ttft_s > self.ttft_s):
            return False
        if self.tpot_s is not None and (est.tpot_s is None or est.tpot_s > self.tpot_s):
            return False
        return self.tokens_per_s is None or est.decode_tokens_per_s_total >= self.tokens_per_s


@dataclass(slots=True)
class Recommendation:
    """What the Plan tab recommends, and against what: `as_planned` is the cheapest in the plan's own
    quantization (None: none meets the targets), `best` the recommendation (None: nothing does)."""

    plan_quant: str  # the plan's quantization as resolved ("gguf-q4_1" for auto on a Q4_1 GGUF)
    best: Estimate | None
    as_planned: Estimate | None

    @property
    def changes_quant(self) -> bool:
        return self.best is not None and self.best is not self.as_planned

    def reason(self) -> str:
        """Why the recommendation quantizes differently from the plan ("" when it does not)."""
        if not self.changes_quant:
            return ""
        best, planned = self.best, self.as_planned
        assert best is not None
        need = f"it needs a checkpoint with {best.quant} weights"
        if planned is None:
            return f"with {self.plan_quant} no catalog GPU fits the workload and targets; {need}"
        return (
            f"${best.price_per_hour:.2f}/h against ${planned.price_per_hour:.2f}/h for the cheapest with "
            f"{self.plan_quant} ({planned.num_gpus} × {planned.gpu}); {need}"
        )


def _cheapest(req: PlanRequest, spec: ModelSpec, quants: list[str], targets: Targets) -> Estimate | None:
    """The cheapest per hour of every (GPU, count) with the first of `quants` that meets the targets
    there; ties go to higher quality (earlier in quants), then speed."""
    best, best_key = None, None
    for gpu in list_gpus():
        if gpu == "CPU" and req.engine not in CPU_ENGINES:
            continue
        for count in [1, *tp_options(spec, 1)]:
            for rank, quant in enumerate(quants):
                trial = try_estimate(req, spec, gpu=gpu, num_gpus=count, tp=count, pp=1, quant=quant)
                if trial is None or not targets.are_met(trial, req):
                    continue
                key = (trial.price_per_hour, rank, -trial.decode_tokens_per_s_total)
                if best_key is None or key < best_key:
                    best, best_key = trial, key
                break  # higher-quality quantizations come first: the rest only cost quality
    return best


def recommendation(req: PlanRequest, targets: Targets | None = None) -> Recommendation:
    """The cheapest configuration in the plan's quantization, or in one with fewer bits when that is
    strictly cheaper per hour (or the only one that meets the targets)."""
    spec = load_model_spec(req.model, req.revision)
    targets = targets or Targets()
    own = resolve_quant(req.quant, spec)
    smaller = [
        q
        for q in RECOMMEND_QUANTS
        if get_quantization(q).bits < own.bits and req.engine in get_quantization(q).engines
    ]
    as_planned = _cheapest(req, spec, [req.quant], targets)
    other = _cheapest(req, spec, smaller, targets) if smaller else None
    cheaper = other is not None and (as_planned is None or other.price_per_hour < as_planned.price_per_hour)
    return Recommendation(own.name, other if cheaper else as_planned, as_planned)


def recommend(
    req: PlanRequest,
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    tokens_per_s: float | None = None,
) -> Estimate | None:
    """recommendation(req, Targets(...)).best: the configuration alone."""
    return recommendation(req, Targets(ttft_s, tpot_s, tokens_per_s)).best
