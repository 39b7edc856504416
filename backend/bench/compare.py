"""Compare engines: the same benchmark workload (dataset, seed, request count, concurrency) against each
target in turn, with each target's /metrics and process memory sampled during its run.

Every target's prompts begin with a salt of its own (`prompt_salts`): the same prompts, lengths and token
counts otherwise, but no KV block in common, so no target is served from a prefix cache an earlier target
filled (one server given twice, or a server benchmarked before). Resetting the cache instead is not
portable: vLLM serves POST /reset_prefix_cache only in its dev mode, and our server has no such route.

One row per target: output and total tok/s, TTFT/TPOT/ITL p50 and p99, failed requests, peak resident
memory of a local engine (its processes and their children), KV-cache capacity in tokens, and the planner's
estimate for the same settings beside the measured memory.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import psutil

from backend.bench.serve import BenchConfig, BenchResult, run_benchmark
from backend.monitor.samples import MetricsPoller

if TYPE_CHECKING:
    from backend.quality.statistics import QualityResult


@dataclass(slots=True)
class CompareTarget:
    """One server to benchmark. `pids` lists a local engine's processes (None: a remote URL)."""

    name: str
    base_url: str  # its OpenAI API root
    model: str  # the name its /v1 answers to
    pids: Callable[[], list[int]] | None = None
    kv_cache_tokens: int | None = None  # when the engine says so itself (vLLM's startup log)
    block_size: int = 16
    planned: dict = field(default_factory=dict)  # planner: weights_bytes, kv_bytes_per_token, kv_cache_tokens
    detail: str = ""  # how it ran (vLLM: compiled or eager, its thread binding), for the report
    tokenizer: str | None = None  # the model it serves (folder, .gguf or Hub id) when known; None: a URL


# A comparison runs every target in turn from this process: bounded whoever asks (CLI, UI, public or not).
# Ours, not measured: 10x the CLI's default request count, vLLM's largest --max-num-seqs default (1024)
# as concurrency, and lengths beyond any context we serve on a CPU.
COMPARE_LIMITS = {"num_prompts": 10_000, "max_concurrency": 1024, "input_len": 131_072, "output_len": 32_768}
MAX_COMPARE_RUNS = 16  # concurrencies in one comparison, each a run of num_prompts per target


@dataclass(slots=True)
class Workload:
    dataset: str = "chat"
    num_prompts: int = 50
    max_concurrency: int = 16
    input_len: int = 256
    output_len: int = 128
    seed: int = 0
    skip_requests: int = 0  # where this run's slice of the seed's request stream starts
    request_rate: float = math.inf
    timeout_s: float = 600.0
    ignore_eos: bool = False
    tokenizer: str | None = None  # random prompts as token ids of this tokenizer (vLLM's random dataset)
    salt: str = ""  # before every prompt: one per target (prompt_salts)

    def __post_init__(self) -> None:
        for name, limit in COMPARE_LIMITS.items():
            value = getattr(self, name)
            if not 1 <= value <= limit:
                raise ValueError(f"{name} must be in 1..{limit:,} for a comparison, got {value}")

    def config(self, target: CompareTarget) -> BenchConfig:
        return BenchConfig(
            base_url=target.base_url,
            model=target.model,
            dataset=self.dataset,
            num_prompts=self.num_prompts,
            max_concurrency=self.max_concurrency,
            input_len=self.input_len,
            output_len=self.output_len,
            seed=self.seed,
            skip_requests=self.skip_requests,
            request_rate=self.request_rate,
            timeout_s=self.timeout_s,
            ignore_eos=self.ignore_eos,
            tokenizer=self.tokenizer,
            salt=self.salt,
        )


SALT_DIGITS = 8


def prompt_salts(count: int, tokenizer: str | None = None) -> list[str]:
    """`count` distinct salts such as "[40719362]\n", drawn afresh for each comparison (a second one
    against the same server finds none of the first's prompts cached). With the tokenizer known, all of
    them encode to the same number of tokens, so every target gets the same prompt token counts."""
    from backend.bench.datasets import load_tokenizer

    rng, salts, lengths = random.SystemRandom(), [], set[int]()
    encode = load_tokenizer(tokenizer) if tokenizer else None
    for _ in range(100 * count):
        salt = f"[{rng.randrange(10**SALT_DIGITS):0{SALT_DIGITS}d}]\n"
        length = len(encode(salt, add_special_tokens=False)["input_ids"]) if encode else 0
        if salt in salts or (lengths and length not in lengths):
            continue  # a tokenizer that merges digits: draw until the count matches the first salt's
        salts.append(salt)
        lengths.add(length)
        if len(salts) == count:
            return salts
    raise RuntimeError(f"no {count} salts of one token count in {100 * count} draws")


def with_target_tokenizer(workload: Workload, targets: list[CompareTarget]) -> Workload:
    """workload with the tokenizer of the model the first target that knows it serves, as the Compare tab
    runs it: `random` prompts are then token ids (vLLM's random dataset, the prompts `app.py compare` sends
    for the same seed and lengths); with only URLs, runs of corpus words."""
    return replace(workload, tokenizer=next((t.tokenizer for t in targets if t.tokenizer), None))


def split_runs(
    workload: Workload, concurrencies: list[int], warmup: int
) -> tuple[Workload | None, list[Workload]]:
    """One seed's request stream cut into the warm-up (its first `warmup` requests) and then one slice of
    num_prompts per concurrency, in order: no run re-sends another's prompts (a server's prefix cache
    would serve them), and every target gets the same slice at the same concurrency."""
    if len(concurrencies) > MAX_COMPARE_RUNS:
        raise ValueError(f"at most {MAX_COMPARE_RUNS} concurrencies per comparison, got {len(concurrencies)}")
    warm = replace(workload, num_prompts=warmup, max_concurrency=max(concurrencies)) if warmup else None
    runs = [
        replace(workload, max_concurrency=c, skip_requests=warmup + i * workload.num_prompts)
        for i, c in enumerate(concurrencies)
    ]
    return warm, runs


@dataclass(slots=True)
class CompareRow:
    target: str
    engine: str  # recognised from its /metrics
    max_concurrency: int
    completed: int
    failed: int
    duration_s: float
    output_tok_s: float
    total_tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    peak_rss_bytes: int | None
    kv_cache_tokens: int | None
    planned_weights_bytes: float | None
    planned_kv_cache_tokens: int | None
    detail: str = ""  # the target's detail
    prompt_salt: str = ""  # before each of its prompts (Workload.salt)
    prefix_cache_hits: int | None = None  # tokens its run found cached (/metrics; None: not exported)
    quality: QualityResult | None = None  # its target against the quality reference (compare_quality.py)
    quality_note: str = ""  # why quality is None


@dataclass(slots=True)
class TargetRun:
    row: CompareRow
    samples: list[dict]  # /metrics samples during the run, with "t" (s since its start) and "rss_bytes"
    result: BenchResult


def rss_of(pids: list[int]) -> int | None:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total or None


class Sampler:
    """Polls a target's /metrics and resident memory every interval_s in a thread while it runs."""

    def __init__(self, target: CompareTarget, interval_s: float = 1.0) -> None:
        self.target, self.interval_s = target, interval_s
        self.poller = MetricsPoller(target.base_url)
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sample-{target.name}", daemon=True)
        self.start = 0.0

    def _run(self) -> None:
        while True:
            self.take()
            if self._stop.wait(self.interval_s):
                return

    def take(self) -> None:
        sample = self.poller.poll()
        sample["t"] = time.monotonic() - self.start
        sample["rss_bytes"] = rss_of(self.target.pids()) if self.target.pids else None
        self.samples.append(sample)

    def __enter__(self) -> Sampler:
        self.start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.take()  # the counters after the last request


def kv_capacity(target: CompareTarget, samples: list[dict]) -> int | None:
    if target.kv_cache_tokens:
        return target.kv_cache_tokens
    blocks = next((s["num_kv_blocks_total"] for s in samples if s.get("num_kv_blocks_total")), None)
    return int(blocks * target.block_size) if blocks else None


def counter_rise(samples: list[dict], key: str) -> int | None:
    """How far a /metrics counter rose from the first sample to the last (None: not exported)."""
    values = [s[key] for s in samples if s.get(key) is not None]
    return int(values[-1] - values[0]) if values else None


def make_row(
    target: CompareTarget, result: BenchResult, samples: list[dict], workload: Workload
) -> CompareRow:
    p = result.percentiles
    rss = [s["rss_bytes"] for s in samples if s.get("rss_bytes")]
    engines = [s["engine"] for s in samples if s.get("engine") not in (None, "unknown")]
    return CompareRow(
        target=target.name,
        engine=engines[0] if engines else "unknown",
        max_concurrency=workload.max_concurrency,
        completed=result.completed,
        failed=result.failed,
        duration_s=result.duration,
        output_tok_s=result.output_throughput,
        total_tok_s=result.total_token_throughput,
        ttft_p50_ms=p["median_ttft_ms"],
        ttft_p99_ms=p["p99_ttft_ms"],
        tpot_p50_ms=p["median_tpot_ms"],
        tpot_p99_ms=p["p99_tpot_ms"],
        itl_p50_ms=p["median_itl_ms"],
        itl_p99_ms=p["p99_itl_ms"],
        peak_rss_bytes=max(rss) if rss else None,
        kv_cache_tokens=kv_capacity(target, samples),
        planned_weights_bytes=target.planned.get("weights_bytes"),
        planned_kv_cache_tokens=target.planned.get("kv_cache_tokens"),
        detail=target.detail,
        prompt_salt=workload.salt,
        prefix_cache_hits=counter_rise(samples, "prefix_cache_hits_total"),
    )


def run_target(target: CompareTarget, workload: Workload, progress=None) -> TargetRun:
    config = workload.config(target)
    with Sampler(target) as sampler:
        result = run_benchmark(config, progress=progress)
    row = make_row(target, result, sampler.samples, workload)
    return TargetRun(row, sampler.samples, result)


@dataclass(slots=True)
class OfflineRun:
    """The embedded engine offline (LLM.generate) on one run's prompts: the served figure's ceiling."""

    max_concurrency: int
    output_tok_s: float | None  # None: it failed (detail says why)
    detail: str
    prompt_tokens: int = 0  # as the served run's usage counted them when the prompts are the same


@dataclass(slots=True)
class Comparison:
    workload: Workload
    runs: list[TargetRun]
    offline: list[OfflineRun] = field(default_factory=list)
    quality_reference: QualityResult | None = None  # the reference against itself: its PPL, its label

    def rows(self) -> list[CompareRow]:
        return [run.row for run in self.runs]

    def to_dict(self) -> dict:
        def clean(sample: dict) -> dict:
            return {k: v for k, v in sample.items() if not k.startswith("_")}

        workload = asdict(self.workload) | {"request_rate": str(self.workload.request_rate)}
        return {
            "workload": workload,
            "rows": [asdict(run.row) for run in self.runs],
            "offline": [asdict(run) for run in self.offline],
            "quality_reference": asdict(self.quality_reference) if self.quality_reference else None,
            "samples": {run.row.target: [clean(s) for s in run.samples] for run in self.runs},
            "results": {run.row.target: run.result.to_dict() for run in self.runs},
        }


def run_compare(
    targets: list[CompareTarget], workload: Workload, progress: Callable[[str, int, int], None] | None = None
) -> Comparison:
    """Each target in turn (never at once: they would share the CPU), the same workload and seed, each
    with its own prompt salt."""
    if len({t.name for t in targets}) != len(targets):
        raise ValueError(f"target names must differ, got {[t.name for t in targets]}")
    runs = []
    for target, salt in zip(targets, prompt_salts(len(targets), workload.tokenizer), strict=True):
        report = (lambda done, total, name=target.name: progress(name, done, total)) if progress else None
        runs.append(run_target(target, replace(workload, salt=salt), report))
    return Comparison(workload, runs)
