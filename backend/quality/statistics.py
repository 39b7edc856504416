"""QualityResult: llama.cpp's `llama-perplexity --kl-divergence` statistics of one model against the
reference, from the per-token figures of every scored position (scores.TokenStats).

Every formula is perplexity.cpp's (`mean_and_uncertainty`, `covariance`, `percentile`, the median):
- PPL = exp(mean NLL) +/- PPL * the standard error of the mean NLL; the same for the reference;
- ln(PPL(Q)/PPL(base)) = mean NLL - mean NLL(base), its uncertainty with the two means' covariance;
- mean KLD +/- its standard error; KLD percentiles by linear interpolation between sorted values
  (`p = fraction * (n - 1)`), the median as the middle value (the mean of the two middle ones);
- RMS dp: the root mean square of p(token) - p_base(token);
- Same top p: the share of positions whose most likely token is the reference's, +/- sqrt(p(1-p)/(n-1)).
A standard error is 0 below 11 tokens, as there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from backend.quality.scores import KldKind, TokenStats

MIN_COUNT_FOR_ERROR = 10  # perplexity.cpp: `count > 10` for an uncertainty, `count < 10` no covariance


@dataclass(slots=True)
class QualityResult:
    model: str  # its label (the model spec)
    reference: str
    num_tokens: int  # scored tokens
    ppl: float
    ppl_uncertainty: float
    reference_ppl: float
    reference_ppl_uncertainty: float
    ln_ppl_ratio: float  # ln(PPL(Q)/PPL(base))
    ln_ppl_ratio_uncertainty: float
    ppl_ratio: float
    ppl_ratio_uncertainty: float
    kld_kind: KldKind  # exact (whole rows), lower bound (a server's top-k) or n/a
    kld_mean: float | None
    kld_mean_uncertainty: float | None
    kld_median: float | None
    kld_p90: float | None
    kld_p95: float | None
    kld_p99: float | None
    kld_p999: float | None
    kld_max: float | None
    rms_delta_p: float  # RMS of p(token) - p_base(token), as a fraction (llama.cpp prints %)
    rms_delta_p_uncertainty: float
    same_top_p: float  # fraction of positions with the reference's top token
    same_top_p_uncertainty: float


def mean_and_uncertainty(values: torch.Tensor) -> tuple[float, float]:
    count = values.numel()
    if count < 1:
        return 0.0, 0.0
    mean = float(values.sum()) / count
    variance = float((values * values).sum()) / count - mean * mean
    error = math.sqrt(variance / (count - 1)) if variance > 0 and count > MIN_COUNT_FOR_ERROR else 0.0
    return mean, error


def covariance(a: torch.Tensor, b: torch.Tensor) -> float:
    """The covariance of the two means (perplexity.cpp's, divided by count - 1 once more)."""
    count = a.numel()
    if count < MIN_COUNT_FOR_ERROR:
        return 0.0
    mean_a, mean_b = float(a.sum()) / count, float(b.sum()) / count
    return (float((a * b).sum()) / count - mean_a * mean_b) / (count - 1)


def percentile(sorted_values: torch.Tensor, fraction: float) -> float:
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    position = fraction * (sorted_values.numel() - 1)
    index = int(position)
    weight = position - index
    upper = min(index + 1, sorted_values.numel() - 1)
    return float((1 - weight) * sorted_values[index] + weight * sorted_values[upper])


def median(sorted_values: torch.Tensor) -> float:
    n = sorted_values.numel()
    if n % 2 == 0:
        return float(0.5 * (sorted_values[n // 2] + sorted_values[n // 2 - 1]))
    return float(sorted_values[n // 2])


def summarize(model: str, reference: str, chunks: list[TokenStats]) -> QualityResult:
    """The statistics over all scored tokens of all chunks."""
    nll = torch.cat([c.nll for c in chunks])
    nll_base = torch.cat([c.nll_base for c in chunks])
    log_ppl, log_ppl_error = mean_and_uncertainty(nll)
    log_base, log_base_error = mean_and_uncertainty(nll_base)
    cov = covariance(nll, nll_base)
    ratio = log_ppl - log_base
    ratio_error = math.sqrt(max(0.0, log_ppl_error**2 + log_base_error**2 - 2.0 * cov))
    delta_p = torch.exp(-nll) - torch.exp(-nll_base)
    mse, mse_error = mean_and_uncertainty(delta_p * delta_p)
    rms = math.sqrt(mse)
    same = float(torch.cat([c.same_top for c in chunks]).double().mean())
    count = nll.numel()
    return QualityResult(
        model=model,
        reference=reference,
        num_tokens=count,
        ppl=math.exp(log_ppl),
        ppl_uncertainty=math.exp(log_ppl) * log_ppl_error,
        reference_ppl=math.exp(log_base),
        reference_ppl_uncertainty=math.exp(log_base) * log_base_error,
        ln_ppl_ratio=ratio,
        ln_ppl_ratio_uncertainty=ratio_error,
        ppl_ratio=math.exp(ratio),
        ppl_ratio_uncertainty=math.exp(ratio) * ratio_error,
        **kld_fields(chunks),
        rms_delta_p=rms,
        rms_delta_p_uncertainty=0.5 / rms * mse_error if rms > 0 else 0.0,
        same_top_p=same,
        same_top_p_uncertainty=math.sqrt(same * (1 - same) / (count - 1)) if count > 1 else 0.0,
    )


def kld_fields(chunks: list[TokenStats]) -> dict:
    """The KL statistics, or None for each when a chunk has no KL (a server reference)."""
    kinds = {c.kld_kind for c in chunks}
    kind: KldKind = "n/a" if "n/a" in kinds else ("lower bound" if "lower bound" in kinds else "exact")
    names = ("mean", "mean_uncertainty", "median", "p90", "p95", "p99", "p999", "max")
    if kind == "n/a":
        return {"kld_kind": kind} | {f"kld_{name}": None for name in names}
    kld = torch.cat([c.kld for c in chunks if c.kld is not None])
    values = kld.sort().values
    mean, error = mean_and_uncertainty(kld)
    return {
        "kld_kind": kind,
        "kld_mean": mean,
        "kld_mean_uncertainty": error,
        "kld_median": median(values),
        "kld_p90": percentile(values, 0.90),
        "kld_p95": percentile(values, 0.95),
        "kld_p99": percentile(values, 0.99),
        "kld_p999": percentile(values, 0.999),
        "kld_max": float(values[-1]),
    }
