"""Prometheus metrics under vLLM's names (``vllm:`` prefix, ``model_name`` label).

Gauges and token counters are read from the engine's ``stats()`` at scrape time, so they also count
requests that did not come through HTTP (the UI's chat). Latency histograms are observed per HTTP
request. Our additions that vLLM has no name for use the ``playground:`` prefix.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from backend.server.engine_provider import EngineProvider

if TYPE_CHECKING:
    from backend.engine.async_llm import AsyncLLM

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)

GAUGES = {  # EngineStats field -> (metric name, help)
    "num_requests_running": ("vllm:num_requests_running", "Number of requests in model execution batches."),
    "num_requests_waiting": ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
    "num_kv_blocks_used": ("playground:kv_cache_blocks_used", "KV-cache blocks held by requests."),
    "num_kv_blocks_total": ("playground:kv_cache_blocks_total", "KV-cache blocks in the pool."),
    "compute_threads": (
        "playground:compute_threads",
        "CPU threads the engine's steps run on now (fewer while other processes take its cores; 0: GPU).",
    ),
}
COUNTERS = {
    "prompt_tokens_total": ("vllm:prompt_tokens", "Number of prefill tokens processed."),
    "generation_tokens_total": ("vllm:generation_tokens", "Number of generation tokens processed."),
    "num_preemptions_total": ("vllm:num_preemptions", "Cumulative number of preemptions."),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries", "Prefix cache queries, in tokens."),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens."),
}


PREFIX_CACHE_COUNTERS = ("prefix_cache_queries_total", "prefix_cache_hits_total")
SPEC_DECODE_COUNTERS = {  # only while speculative decoding is on, as in vLLM (v1/spec_decode/metrics.py)
    "spec_decode_num_drafts_total": ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
    "spec_decode_num_draft_tokens_total": ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
    "spec_decode_num_accepted_tokens_total": (
        "vllm:spec_decode_num_accepted_tokens",
        "Number of accepted tokens.",
    ),
}


class EngineCollector:
    """Reads the current engine's stats() on every scrape; yields nothing while no engine runs.

    Without ``expose_prefix_cache`` (a public app) the prefix-cache counters are left out: polled
    around one's own request they tell whether another visitor sent a prompt with the same beginning."""

    def __init__(
        self,
        engine_provider: EngineProvider,
        model_name: Callable[[AsyncLLM], str],
        expose_prefix_cache: bool = True,
    ):
        self.engine_provider = engine_provider
        self.model_name = model_name
        self.counters = {
            key: value
            for key, value in COUNTERS.items()
            if expose_prefix_cache or key not in PREFIX_CACHE_COUNTERS
        }

    def collect(self) -> Iterator[Metric]:
        engine = self.engine_provider()
        if engine is None:
            return
        stats = engine.stats()
        values = stats.to_dict()  # the metrics edge: GAUGES and counters are keyed by field name
        name = self.model_name(engine)
        for key, (metric, doc) in GAUGES.items():
            family = GaugeMetricFamily(metric, doc, labels=["model_name"])
            family.add_metric([name], float(values[key]))
            yield family
        for key, (metric, doc) in self.counters.items():
            counter = CounterMetricFamily(metric, doc, labels=["model_name"])
            counter.add_metric([name], float(values[key]))
            yield counter
        if stats.speculative_method is not None:
            yield from spec_decode_metrics(values, name)
        if stats.expert_tokens_total:
            yield expert_tokens_metric(stats.expert_tokens_total, name)
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "model_name"],
        )
        info.add_metric([str(stats.block_size), str(stats.num_kv_blocks_total), name], 1.0)
        yield info


def expert_tokens_metric(counts: list[list[int]], name: str) -> Metric:
    """A MoE model's token -> expert assignments per layer (its MoE layers counted from 0) and expert."""
    counter = CounterMetricFamily(
        "playground:moe_expert_tokens",
        "Token to expert assignments routed by each MoE layer's router (top_k per token).",
        labels=["model_name", "layer", "expert"],
    )
    for layer, experts in enumerate(counts):
        for expert, count in enumerate(experts):
            counter.add_metric([name, str(layer), str(expert)], float(count))
    return counter


def spec_decode_metrics(values: dict, name: str) -> Iterator[Metric]:
    for key, (metric, doc) in SPEC_DECODE_COUNTERS.items():
        counter = CounterMetricFamily(metric, doc, labels=["model_name"])
        counter.add_metric([name], float(values[key]))
        yield counter
    per_pos = CounterMetricFamily(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Accepted tokens per draft position.",
        labels=["model_name", "position"],
    )
    for position, count in enumerate(values["spec_decode_num_accepted_tokens_per_pos_total"]):
        per_pos.add_metric([name, str(position)], float(count))
    yield per_pos


class ServerMetrics:
    """One registry per app (tests run several apps in one process)."""

    def __init__(
        self,
        engine_provider: EngineProvider,
        model_name: Callable[[AsyncLLM], str],
        expose_prefix_cache: bool = True,
    ):
        disable_created_metrics()  # like vLLM: no *_created series
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token in seconds.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Inter-token latency in seconds.",
            labels,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency in seconds.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Time spent waiting in the queue.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_len = Histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens per request.",
            labels,
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.gen_len = Histogram(
            "vllm:request_generation_tokens",
            "Number of generated tokens per request.",
            labels,
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of finished requests by finish reason.",
            ["model_name", "finished_reason"],
            registry=r,
        )
        r.register(EngineCollector(engine_provider, model_name, expose_prefix_cache))
        ProcessCollector(registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def recorder(self, model_name: str) -> RequestRecorder:
        return RequestRecorder(self, model_name)


class RequestRecorder:
    """Observes one request's latencies as its outputs stream in."""

    def __init__(self, metrics: ServerMetrics, model_name: str):
        self.metrics = metrics
        self.model_name = model_name
        self.arrival = time.monotonic()
        self.last_token_at: float | None = None
        self.num_tokens = 0

    def on_output(self, output) -> None:
        new = len(output.outputs[0].token_ids) - self.num_tokens
        if new <= 0:
            return
        now = time.monotonic()
        if self.last_token_at is None:
            self.metrics.ttft.labels(self.model_name).observe(now - self.arrival)
            new -= 1
        if new > 0:
            gap = (now - (self.last_token_at or now)) / new
            for _ in range(new):
                self.metrics.itl.labels(self.model_name).observe(gap)
        self.last_token_at = now
        self.num_tokens = len(output.outputs[0].token_ids)

    def on_finish(self, output, finish_reason: str) -> None:
        m = self.metrics
        m.e2e.labels(self.model_name).observe(time.monotonic() - self.arrival)
        m.success.labels(self.model_name, finish_reason).inc()
        if output is None:
            return
        m.prompt_len.labels(self.model_name).observe(len(output.prompt_token_ids))
        m.gen_len.labels(self.model_name).observe(len(output.outputs[0].token_ids))
        times = output.metrics
        if times is not None and times.first_scheduled_time and times.arrival_time:
            m.queue.labels(self.model_name).observe(max(0.0, times.first_scheduled_time - times.arrival_time))
