"""Soak test: ~1,000 requests against `python app.py serve`, the way a busy public server sees them.

Mixed streaming and non-streaming chat and completion requests at a steady concurrency, a third of the
clients disconnecting at random points, a flood (200 requests at concurrency 64) in the middle, and a
sprinkle of malformed requests. It checks what must hold after any such traffic: every good request
completed, only the deliberately bad ones failed (each with a 4xx), no KV block still in use, and the
server's resident memory flat between 10% and 100% of the run (growth under 5%).

    python -m benchmarks.soak                        # starts `app.py serve` on the default model
    python -m benchmarks.soak --base-url URL         # or drives a server that is already running
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx

from benchmarks.soak_server import ServerUnderTest

# Malformed bodies a hostile client sends; each must get a 4xx and leave the server serving.
BAD_BODIES = (
    b'{"prompt": "hi", "temperature": NaN}',
    b'{"prompt": "hi", "repetition_penalty": Infinity}',
    b'{"prompt": "caf\\ud800"}',
    b'{"prompt": "hi", "seed": 18446744073709551616}',
    b'{"prompt": "hi", "stop": [' + b",".join(b'"s%d"' % i for i in range(1000)) + b"]}",
    b'{"prompt": "hi", "max_tokens": 99999999}',
    b'{"prompt": "hi", "logprobs": 50}',
    b'{"prompt": ',
)
TOPICS = ("tides", "bread", "magnets", "volcanoes", "money", "bridges", "sound", "rainbows", "bees")
MAX_RSS_GROWTH = 0.05


@dataclass(slots=True)
class SoakConfig:
    num_requests: int = 1000
    concurrency: int = 16
    flood_size: int = 200
    flood_concurrency: int = 64
    disconnect_fraction: float = 1 / 3
    bad_fraction: float = 0.03
    max_tokens: int = 12
    seed: int = 0


@dataclass(slots=True)
class SoakJob:
    index: int
    chat: bool
    stream: bool
    disconnect_after: float | None  # seconds (non-streaming) or chunks (streaming) before leaving
    bad_body: bytes | None


@dataclass(slots=True)
class SoakReport:
    completed: int = 0
    disconnected: int = 0
    rejected_as_expected: int = 0
    failures: list[str] = field(default_factory=list)
    rss_at_10_percent: int = 0
    rss_at_end: int = 0
    kv_blocks_used_at_end: float = -1.0
    seconds: float = 0.0

    @property
    def rss_growth(self) -> float:
        return (self.rss_at_end - self.rss_at_10_percent) / max(1, self.rss_at_10_percent)

    @property
    def passed(self) -> bool:
        return not self.failures and self.kv_blocks_used_at_end == 0 and self.rss_growth < MAX_RSS_GROWTH


def plan_jobs(config: SoakConfig) -> list[SoakJob]:
    rng = random.Random(config.seed)
    jobs = []
    for i in range(config.num_requests):
        bad = rng.choice(BAD_BODIES) if rng.random() < config.bad_fraction else None
        stream = rng.random() < 0.5
        leaves = bad is None and rng.random() < config.disconnect_fraction
        after = (
            (rng.randint(0, config.max_tokens // 2) if stream else rng.uniform(0.05, 3.0)) if leaves else None
        )
        jobs.append(SoakJob(i, rng.random() < 0.5, stream, after, bad))
    return jobs


async def run_job(http: httpx.AsyncClient, job: SoakJob, config: SoakConfig, report: SoakReport) -> None:
    if job.bad_body is not None:
        resp = await http.post(
            "/v1/completions", content=job.bad_body, headers={"Content-Type": "application/json"}
        )
        if 400 <= resp.status_code < 500 and "error" in resp.json():
            report.rejected_as_expected += 1
        else:
            report.failures.append(f"bad request {job.index}: HTTP {resp.status_code}, expected a 4xx")
        return
    path, body = request_body(job, config)
    try:
        if job.stream:
            finished = await stream_request(http, path, body, job.disconnect_after)
        elif job.disconnect_after is not None:
            try:
                await asyncio.wait_for(http.post(path, json=body), job.disconnect_after)
                finished = True
            except TimeoutError:  # the client gave up: its connection closes, the server aborts it
                finished = False
        else:
            resp = await http.post(path, json=body)
            finished = resp.status_code == 200 and resp.json()["choices"][0]["finish_reason"] in (
                "stop",
                "length",
            )
            if not finished:
                report.failures.append(f"request {job.index}: HTTP {resp.status_code} {resp.text[:200]}")
                return
    except (httpx.HTTPError, ValueError) as exc:
        report.failures.append(f"request {job.index}: {type(exc).__name__}: {exc}")
        return
    if finished:
        report.completed += 1
    else:
        report.disconnected += 1


def request_body(job: SoakJob, config: SoakConfig) -> tuple[str, dict]:
    text = f"In two sentences, explain {TOPICS[job.index % len(TOPICS)]} to a child (request {job.index})."
    common = {"max_tokens": config.max_tokens, "temperature": 0.7, "seed": job.index, "stream": job.stream}
    if job.chat:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": text}], **common}
    return "/v1/completions", {"prompt": text, **common}


async def stream_request(http: httpx.AsyncClient, path: str, body: dict, leave_after: float | None) -> bool:
    """True when the stream ran to its end (a finish_reason, then [DONE]); False when we left early."""
    chunks, finished = 0, False
    async with http.stream("POST", path, json=body) as resp:
        if resp.status_code != 200:
            raise ValueError(f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if leave_after is not None and chunks >= leave_after:
                return False  # leaving the block closes the connection mid-stream
            if line == "data: [DONE]":
                return finished
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                raise ValueError(f"error in the stream: {chunk['error']}")
            finished = finished or any(c.get("finish_reason") for c in chunk["choices"])
            chunks += 1
    return finished


async def run_phase(
    http, jobs: list[SoakJob], concurrency: int, config: SoakConfig, report: SoakReport, on_done
) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(job: SoakJob) -> None:
        async with gate:
            await run_job(http, job, config, report)
        on_done()

    await asyncio.gather(*(one(job) for job in jobs))


async def soak(server: ServerUnderTest, config: SoakConfig) -> SoakReport:
    report, jobs = SoakReport(), plan_jobs(config)
    half = (len(jobs) - config.flood_size) // 2
    before, flood, after = (
        jobs[:half],
        jobs[half : half + config.flood_size],
        jobs[half + config.flood_size :],
    )
    done, ten_percent = 0, max(1, len(jobs) // 10)

    def on_done() -> None:
        nonlocal done
        done += 1
        if done == ten_percent:
            report.rss_at_10_percent = server.rss_bytes()

    started = time.monotonic()
    limits = httpx.Limits(max_connections=config.flood_concurrency + config.concurrency)
    async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as http:
        await run_phase(http, before, config.concurrency, config, report, on_done)
        await run_phase(http, flood, config.flood_concurrency, config, report, on_done)
        await run_phase(http, after, config.concurrency, config, report, on_done)
    report.seconds = time.monotonic() - started
    report.kv_blocks_used_at_end = await server.wait_idle()
    report.rss_at_end = server.rss_bytes()
    return report


def format_report(report: SoakReport, config: SoakConfig) -> str:
    mib = 1024 * 1024
    lines = [
        f"requests sent:            {config.num_requests} (flood of {config.flood_size} at concurrency "
        f"{config.flood_concurrency}, else {config.concurrency})",
        f"completed:                {report.completed}",
        f"disconnected on purpose:  {report.disconnected}",
        f"malformed, refused (4xx): {report.rejected_as_expected}",
        f"failed (unexpected):      {len(report.failures)}",
        *(f"  - {failure}" for failure in report.failures[:10]),
        f"KV blocks in use at end:  {report.kv_blocks_used_at_end:.0f}",
        f"server RSS at 10%:        {report.rss_at_10_percent / mib:,.1f} MiB",
        f"server RSS at 100%:       {report.rss_at_end / mib:,.1f} MiB ({report.rss_growth:+.2%}, limit "
        f"+{MAX_RSS_GROWTH:.0%})",
        f"duration:                 {report.seconds:,.0f} s",
        f"result:                   {'PASS' if report.passed else 'FAIL'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="a running server (default: start `app.py serve`)")
    parser.add_argument("--model", default=None, help="model for the started server (default: SmolLM2-135M)")
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--flood-size", type=int, default=200)
    parser.add_argument("--flood-concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = SoakConfig(
        num_requests=args.num_requests,
        concurrency=args.concurrency,
        flood_size=min(args.flood_size, args.num_requests),
        flood_concurrency=args.flood_concurrency,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    with ServerUnderTest(args.base_url, args.model) as server:
        report = asyncio.run(soak(server, config))
    print(format_report(report, config), flush=True)
    return 0 if report.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
