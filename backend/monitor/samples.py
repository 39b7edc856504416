"""One normalised time series from any server's Prometheus /metrics, or from our engine's stats().

The engine is recognised from its metric names (vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM, ours).
Token rates come from counter deltas between two polls, latency quantiles from the histogram buckets
that filled between them. Missing quantities are None.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from backend.monitor.metric_names import ENGINE_METRICS, SIGNATURES

if TYPE_CHECKING:
    from backend.engine.stats import EngineStats  # the engine (and torch) only when it runs here

SAMPLE_KEYS = (
    "timestamp",
    "engine",
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage",
    "num_kv_blocks_used",
    "num_kv_blocks_total",
    "prompt_tokens_per_s",
    "generation_tokens_per_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "itl_p50_s",
    "itl_p99_s",
    "num_preemptions_total",
    "prefix_cache_hit_rate",
    "spec_decode_acceptance_rate",  # accepted / draft tokens since the last sample (None: no drafts)
    "spec_decode_mean_acceptance_length",  # tokens per verification since the last sample, bonus included
    "compute_threads",  # the embedded engine's CPU threads now (None for other engines, 0 on a GPU)
)
COUNTER_KEYS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "spec_decode_num_drafts_total",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
)


@dataclass(slots=True)
class Scrape:
    """The samples of one /metrics text: sample name -> [(labels, value)]."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def total(self, names: tuple[str, ...]) -> float | None:
        """Sum over label sets of the first of ``names`` that is present."""
        for name in names:
            if name in self.samples:
                return sum(value for _, value in self.samples[name])
        return None

    def buckets(self, names: tuple[str, ...]) -> dict[float, float] | None:
        """Cumulative bucket counts (le -> count) of the first histogram present, summed over labels."""
        for name in names:
            rows = self.samples.get(f"{name}_bucket")
            if rows:
                out: dict[float, float] = {}
                for labels, value in rows:
                    le = float(labels["le"])
                    out[le] = out.get(le, 0.0) + value
                return dict(sorted(out.items()))
        return None


def parse_metrics(text: str) -> Scrape:
    scrape = Scrape()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            scrape.samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return scrape


def detect_engine(scrape: Scrape) -> str:
    for engine, prefix in SIGNATURES:
        if any(name.startswith(prefix) for name in scrape.samples):
            return engine
    return "unknown"


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket holding rank q."""
    if not buckets:
        return None
    total = buckets.get(math.inf, max(buckets.values()))
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for le, count in buckets.items():
        if count >= rank:
            if math.isinf(le):
                return lower
            width = count - below
            return lower + (le - lower) * ((rank - below) / width if width > 0 else 1.0)
        lower, below = le, count
    return lower


def _rate(cur: dict, prev: dict | None, key: str) -> float | None:
    if prev is None or cur.get(key) is None or prev.get(key) is None:
        return None
    dt = cur["timestamp"] - prev["timestamp"]
    delta = cur[key] - prev[key]
    return delta / dt if dt > 0 and delta >= 0 else None


def _hit_rate(cur: dict, prev: dict | None) -> float | None:
    q, h = cur.get("prefix_cache_queries_total"), cur.get("prefix_cache_hits_total")
    if q is None or h is None:
        return None
    if (
        prev is not None
        and prev.get("prefix_cache_queries_total") is not None
        and q > prev["prefix_cache_queries_total"]
    ):
        return (h - prev["prefix_cache_hits_total"]) / (q - prev["prefix_cache_queries_total"])
    return h / q if q > 0 else None


def _delta(cur: dict, prev: dict | None, key: str) -> float | None:
    """The counter's growth since prev (its total without prev or after a restart); None if absent."""
    if cur.get(key) is None:
        return None
    old = (prev or {}).get(key)
    return cur[key] - old if old is not None and cur[key] >= old else cur[key]


def _speculation(sample: dict, previous: dict | None) -> None:
    """Acceptance rate and mean accepted length of the drafts verified since ``previous``."""
    drafts = _delta(sample, previous, "spec_decode_num_drafts_total")
    draft_tokens = _delta(sample, previous, "spec_decode_num_draft_tokens_total")
    accepted = _delta(sample, previous, "spec_decode_num_accepted_tokens_total")
    if drafts and draft_tokens and accepted is not None:
        sample["spec_decode_acceptance_rate"] = accepted / draft_tokens
        sample["spec_decode_mean_acceptance_length"] = 1 + accepted / drafts


def _finish(sample: dict, previous: dict | None) -> dict:
    """Fill the rate fields from counter deltas against ``previous`` (a sample or a stats dict)."""
    sample["prompt_tokens_per_s"] = _rate(sample, previous, "prompt_tokens_total")
    sample["generation_tokens_per_s"] = _rate(sample, previous, "generation_tokens_total")
    if sample.get("prefix_cache_hit_rate") is None:
        sample["prefix_cache_hit_rate"] = _hit_rate(sample, previous)
    _speculation(sample, previous)
    return sample


def sample_from_text(text: str, previous: dict | None = None, timestamp: float | None = None) -> dict:
    """A normalised sample from one /metrics text; ``previous`` is the last sample of the same server."""
    scrape = parse_metrics(text)
    engine = detect_engine(scrape)
    names = ENGINE_METRICS.get(engine, {})
    sample = dict.fromkeys(SAMPLE_KEYS)
    sample.update(timestamp=time.time() if timestamp is None else timestamp, engine=engine)
    for key in (*SAMPLE_KEYS, *COUNTER_KEYS):
        if key in names:
            sample[key] = scrape.total(names[key])
    if engine == "vllm" and sample["kv_cache_usage"] is not None:
        blocks = [
            float(labels["num_gpu_blocks"])
            for labels, _ in scrape.samples.get("vllm:cache_config_info", [])
            if labels.get("num_gpu_blocks", "").isdigit()
        ]
        if blocks:
            sample["num_kv_blocks_total"] = blocks[0]
            sample["num_kv_blocks_used"] = round(sample["kv_cache_usage"] * blocks[0])
    for metric in ("ttft", "itl"):
        cur = scrape.buckets(names.get(metric, ()))
        sample[f"_{metric}_buckets"] = cur
        if cur is None:
            continue
        old = (previous or {}).get(f"_{metric}_buckets")
        window = {le: n - old.get(le, 0.0) for le, n in cur.items()} if old else cur
        if old and any(v < 0 for v in window.values()):  # the server restarted
            window = cur
        sample[f"{metric}_p50_s"] = histogram_quantile(0.5, window)
        sample[f"{metric}_p99_s"] = histogram_quantile(0.99, window)
    return _finish(sample, previous)


def sample_from_stats(stats: EngineStats, previous: EngineStats | dict | None = None) -> dict:
    """The same sample from the in-process engine's stats(); ``previous`` is the last stats or sample."""
    values = stats.to_dict()
    if previous is not None and not isinstance(previous, dict):
        previous = previous.to_dict()
    sample = dict.fromkeys(SAMPLE_KEYS)
    sample.update(engine="embedded")
    for key in (
        "timestamp",
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage",
        "num_kv_blocks_used",
        "num_kv_blocks_total",
        "num_preemptions_total",
        "compute_threads",
        *COUNTER_KEYS,
    ):
        sample[key] = values.get(key)
    return _finish(sample, previous)


class MetricsPoller:
    """Polls one server's /metrics; each poll() returns a sample with rates since the previous poll.

    A failed poll returns a sample whose ``error`` says why (and keeps the previous state).
    """

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 5.0, transport=None):
        self.url = metrics_url(url)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self.transport = transport  # an httpx.BaseTransport (e.g. backend.url_guard's) or None
        self.previous: dict | None = None

    def poll(self) -> dict:
        import httpx

        try:
            with httpx.Client(transport=self.transport, trust_env=self.transport is None) as client:
                resp = client.get(self.url, headers=self.headers, timeout=self.timeout_s)
            resp.raise_for_status()
            sample = sample_from_text(resp.text, self.previous)
        except (httpx.HTTPError, ValueError) as exc:  # includes url_guard's refusals (a ValueError)
            sample = dict.fromkeys(SAMPLE_KEYS)
            sample.update(timestamp=time.time(), engine="unknown", error=f"{self.url}: {exc}")
            return sample
        self.previous = sample
        return sample


def metrics_url(url: str) -> str:
    """A server's metrics URL: the path as given when it ends in /metrics, else <base>/metrics (a /v1
    suffix dropped, query and fragment dropped)."""
    import httpx

    parsed = httpx.URL(url.strip())
    path = parsed.path.rstrip("/")
    if not path.endswith("/metrics"):
        path = path.removesuffix("/v1") + "/metrics"
    return str(parsed.copy_with(path=path, query=None, fragment=None))
