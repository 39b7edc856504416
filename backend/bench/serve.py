"""Serving benchmark against any OpenAI-compatible server, reported like `vllm bench serve`.

Requests stream through /v1/completions or /v1/chat/completions; arrivals follow a Poisson process
(``burstiness`` 1) or a gamma process, optionally capped at ``max_concurrency`` in flight. TTFT is the
time to the first content chunk, ITL the gaps between chunks, TPOT (E2E - TTFT) / (output tokens - 1).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from backend.bench.datasets import SampleRequest, iter_requests
from backend.bench.results import BenchResult, RequestResult, format_result, summarize

__all__ = ["BenchConfig", "BenchResult", "RequestResult", "format_result", "run_benchmark"]


@dataclass(slots=True)
class BenchConfig:
    base_url: str
    model: str
    dataset: str = "random"  # random | chat | prefix-repetition | FILE.jsonl
    num_prompts: int = 100
    request_rate: float = math.inf  # requests/s; inf sends all at once
    burstiness: float = 1.0  # gamma shape: 1 = Poisson, < 1 burstier, > 1 steadier
    max_concurrency: int | None = None
    input_len: int = 256
    output_len: int = 128
    range_ratio: float = 0.0  # lengths uniform in [len * (1 - r), len * (1 + r)]
    num_prefixes: int = 4  # prefix-repetition
    prefix_len: int = 192
    seed: int = 0
    skip_requests: int = 0  # start this far into the seed's request stream (disjoint runs of one seed)
    salt: str = ""  # text before every prompt: compare gives each target its own (no shared prefix cache)
    endpoint: str = "auto"  # auto | chat | completions
    temperature: float = 0.0
    ignore_eos: bool = False
    api_key: str | None = None
    tokenizer: str | None = None  # count random/prefix lengths in this tokenizer's tokens
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 (or inf), got {self.request_rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 (or None), got {self.max_concurrency}")
        if self.input_len < 1 or self.output_len < 1:
            raise ValueError(
                f"input_len and output_len must be >= 1, got {self.input_len}, {self.output_len}"
            )
        if self.skip_requests < 0:
            raise ValueError(f"skip_requests must be >= 0, got {self.skip_requests}")
        if not 0 <= self.range_ratio < 1:
            raise ValueError(f"range_ratio must be in [0, 1), got {self.range_ratio}")
        if self.endpoint not in ("auto", "chat", "completions"):
            raise ValueError(f"endpoint must be auto, chat or completions, got {self.endpoint!r}")


def arrival_gaps(rate: float, burstiness: float, rng: random.Random) -> Iterator[float]:
    """Gaps between request starts: gamma(shape=burstiness, mean=1/rate); all zero for rate inf."""
    theta = 0.0 if math.isinf(rate) else 1.0 / (rate * burstiness)
    while True:
        yield rng.gammavariate(burstiness, theta) if theta else 0.0


def arrival_intervals(n: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    return list(itertools.islice(arrival_gaps(rate, burstiness, rng), n))


def _payload(config: BenchConfig, req: SampleRequest, chat: bool) -> dict:
    body = {
        "model": config.model,
        "max_tokens": req.output_len,
        "temperature": config.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.ignore_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = req.messages or [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    return body


async def send_request(client, config: BenchConfig, req: SampleRequest, chat: bool) -> RequestResult:
    """Stream one request; time every content chunk."""
    result, chunks, usage = RequestResult(), 0, None
    path = "/chat/completions" if chat else "/completions"
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", path, json=_payload(config, req, chat)) as resp:
            if resp.status_code != 200:
                result.error = (
                    f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:500]}"
                )
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = str(event["error"])
                    return result
                usage = event.get("usage") or usage
                choice = (event.get("choices") or [{}])[0]
                piece = choice.get("text") or (choice.get("delta") or {}).get("content")
                if piece:
                    now = time.perf_counter()
                    if chunks == 0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last, chunks = now, chunks + 1
    except Exception as exc:  # network errors count as failed requests, like vLLM
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.latency = time.perf_counter() - start
    result.output_len = usage["completion_tokens"] if usage else chunks
    result.prompt_len = usage["prompt_tokens"] if usage else 0
    result.success = chunks > 0 or result.output_len == 0
    if not result.success:
        result.error = "the stream ended without any output"
    return result


async def _run(
    config: BenchConfig, requests: Iterator[SampleRequest], progress, transport=None
) -> BenchResult:
    """Sends the requests as they arrive; each is built only when its turn comes (no list of them all)."""
    import httpx

    limit = config.max_concurrency or config.num_prompts
    gate = asyncio.Semaphore(limit)
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    gaps = arrival_gaps(config.request_rate, config.burstiness, random.Random(config.seed + 1))
    done = 0

    async def one(req: SampleRequest) -> RequestResult:
        nonlocal done
        async with gate:
            chat = config.endpoint == "chat" or (config.endpoint == "auto" and req.messages is not None)
            result = await send_request(client, config, req, chat)
        done += 1
        if progress is not None:
            progress(done, config.num_prompts)
        return result

    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    async with httpx.AsyncClient(
        base_url=config.base_url.rstrip("/"),
        headers=headers,
        limits=limits,
        timeout=httpx.Timeout(config.timeout_s),
        transport=transport,
        trust_env=transport is None,
    ) as client:
        start = time.perf_counter()
        tasks = []
        for req in requests:
            gap = next(gaps)
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one(req)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    totals, stats = summarize(results, duration)
    return BenchResult(config=_config_dict(config), percentiles=stats, requests=results, **totals)


def _config_dict(config: BenchConfig) -> dict:
    """The config for the JSON output: strict JSON (inf as "inf", like vLLM), never the API key."""
    rate = "inf" if math.isinf(config.request_rate) else config.request_rate
    return asdict(config) | {"api_key": None, "request_rate": rate}


def run_benchmark(
    config: BenchConfig,
    progress: Callable[[int, int], None] | None = None,
    transport: Any = None,
) -> BenchResult:
    """Run the benchmark (blocking); ``progress(done, total)`` is called after each request. ``transport``
    (an httpx.AsyncBaseTransport, e.g. backend.url_guard's) carries every request when given."""
    if config.endpoint == "completions" and _holds_messages(config):
        raise ValueError("the dataset holds chat messages: use endpoint 'chat' or 'auto', not 'completions'")
    return asyncio.run(_run(config, iter_requests(config), progress, transport))


def _holds_messages(config: BenchConfig) -> bool:
    if config.dataset == "chat":
        return True
    return config.dataset.endswith(".jsonl") and any(r.messages is not None for r in iter_requests(config))
