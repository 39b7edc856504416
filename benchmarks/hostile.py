"""Hostile requests, one or a few per class of docs/security.md, against a real `app.py serve`: for each,
the status it gets, the response's size, how long it took, and the slowest /health answer while it ran.

    python -m benchmarks.hostile                     # starts `app.py serve` (default model, small queue)
    python -m benchmarks.hostile --base-url URL      # a server already started with SERVER_ARGS

The fairness case connects from 127.0.0.2 and 127.0.0.3 (two clients on one machine), so the server must
listen on 127.0.0.1. A client timeout (default 60 s) stands for "no answer".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from benchmarks.soak_server import ServerUnderTest

SERVER_ARGS = ("--max-num-seqs", "4", "--max-waiting-requests", "32", "--disable-uvicorn-access-log")
MAX_BODY = 4 * 1024 * 1024


@dataclass(slots=True)
class Outcome:
    case: str
    request: str
    status: str  # "200", "400", ... or "no answer in 60 s"
    response_bytes: int
    seconds: float
    slowest_health_s: float = 0.0


def long_key_body() -> bytes:
    key, zeros = "k" * (2 * 1024 * 1024), ",".join(["0"] * 950_000)
    return f'{{"prompt": "hi", "max_tokens": 1, "{key}": [{zeros}]}}'.encode()


def bad_items_body() -> bytes:
    items = ",".join(['"x"'] * ((MAX_BODY - 100) // 4))
    return f'{{"prompt": "hi", "max_tokens": 1, "stop_token_ids": [{items}]}}'.encode()


def json_body(body: dict) -> bytes:
    return json.dumps(body).encode()


async def post(http: httpx.AsyncClient, path: str, body: bytes) -> tuple[str, int]:
    resp = await http.post(path, content=body, headers={"Content-Type": "application/json"})
    return str(resp.status_code), len(resp.content)


async def churn(http: httpx.AsyncClient, count: int = 64, concurrency: int = 16) -> tuple[str, int]:
    """``count`` distinct grammars (each a compile), ``concurrency`` at a time, while another client
    streams: the statuses seen, and that stream's longest wait between two chunks."""
    gate, statuses, size, done = asyncio.Semaphore(concurrency), set(), 0, asyncio.Event()

    async def one(i: int) -> None:
        nonlocal size
        body = {"prompt": "hi", "max_tokens": 4, "structured_outputs": {"regex": f"(ab|cd){{1,{i + 2}}}x"}}
        async with gate:
            status, length = await post(http, "/v1/completions", json_body(body))
        statuses.add(status)
        size += length

    async def bystander() -> float:
        body = {"prompt": "Tell a long story.", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        longest, last = 0.0, None
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            async for _ in resp.aiter_lines():
                now = time.perf_counter()
                longest = max(longest, now - last) if last is not None else 0.0
                last = now
                if done.is_set():
                    break
        return longest

    stream = asyncio.create_task(bystander())
    await asyncio.sleep(1.0)  # the stream is under way
    await asyncio.gather(*(one(i) for i in range(count)))
    done.set()
    gap = await stream
    return f"{'/'.join(sorted(statuses))} (another stream's longest gap {gap * 1000:.0f} ms)", size


async def fairness(url: str, flood: int = 48) -> tuple[str, int]:
    """One client (127.0.0.2) opens ``flood`` long streams, then tops the queue up until it is refused
    (the queue full, or its share used); then another client (127.0.0.3) asks once."""
    body = {"prompt": "Count to a thousand:", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    first = httpx.AsyncClient(
        base_url=url, timeout=60, transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        limits=httpx.Limits(max_connections=2 * flood),
    )  # fmt: skip
    second = httpx.AsyncClient(
        base_url=url, timeout=60, transport=httpx.AsyncHTTPTransport(local_address="127.0.0.3")
    )
    async with first, second:
        held: list[httpx.Response] = []
        for size in (flood, *[4] * 8):  # the burst, then top-ups once the engine took what it runs
            wave = [first.build_request("POST", "/v1/completions", json=body) for _ in range(size)]
            held += await asyncio.gather(*(first.send(r, stream=True) for r in wave))
            if size != flood and any(r.status_code != 200 for r in held[-size:]):
                break
            await asyncio.sleep(0.5)
        refused = sum(r.status_code != 200 for r in held)
        async with second.stream("POST", "/v1/completions", json=body) as other:  # admitted, or not
            status, size = other.status_code, len(await other.aread()) if other.status_code != 200 else 0
        for resp in held:
            await resp.aclose()
    admitted = len(held) - refused
    return f"{status} (client A: {admitted} admitted, {refused} refused)", size


async def measure(url: str, case: str, request: str, action: Callable[[httpx.AsyncClient], Awaitable],
                  timeout_s: float) -> Outcome:  # fmt: skip
    """Run one case while /health is asked every 20 ms; the slowest /health answer during it."""
    done, slowest = asyncio.Event(), 0.0

    async def health() -> None:
        nonlocal slowest
        async with httpx.AsyncClient(base_url=url, timeout=timeout_s + 60) as http:
            while not done.is_set():
                start = time.perf_counter()
                try:
                    await http.get("/health")
                except httpx.TimeoutException:  # the server stopped answering altogether
                    slowest = max(slowest, time.perf_counter() - start)
                    return
                slowest = max(slowest, time.perf_counter() - start)
                await asyncio.sleep(0.02)

    poller = asyncio.create_task(health())
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as http:
        try:
            status, size = await action(http)
        except httpx.TimeoutException:
            status, size = f"no answer in {timeout_s:g} s", 0
    seconds = time.perf_counter() - started
    done.set()
    await poller
    return Outcome(case, request, status, size, seconds, slowest)


def cases(url: str) -> list[tuple[str, str, Callable[[httpx.AsyncClient], Awaitable]]]:
    choice = [f"option {i}" for i in range(20_000)]
    choices = {"prompt": "hi", "max_tokens": 2, "structured_outputs": {"choice": choice}}
    long_prompt = {"prompt": "word " * 700_000, "max_tokens": 1}
    many_messages = {"messages": [{"role": "user", "content": "hi"}] * 100_000, "max_tokens": 1}
    tools = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "tool_choice": "required",
             "tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(5000)]}  # fmt: skip
    return [
        ("1 event loop", "4 MB body: a 2 MiB key over 950k list items",
         lambda http: post(http, "/v1/completions", long_key_body())),
        ("1 tokenizer", "3.5 MB prompt ('word ' x 700k)",
         lambda http: post(http, "/v1/completions", json_body(long_prompt))),
        ("1 chat template", "100k chat messages",
         lambda http: post(http, "/v1/chat/completions", json_body(many_messages))),
        ("2 error body", "1M invalid stop_token_ids",
         lambda http: post(http, "/v1/completions", bad_items_body())),
        ("3 grammar size", "choice of 20,000 strings",
         lambda http: post(http, "/v1/completions", json_body(choices))),
        ("3 tools", "5,000 tools, tool_choice=required",
         lambda http: post(http, "/v1/chat/completions", json_body(tools))),
        ("3 grammar churn", "64 distinct regexes, 16 at a time", churn),
        ("6 fairness", "client A fills the queue (48 streams, then top-ups), then client B asks",
         lambda http: fairness(url)),
    ]  # fmt: skip


async def run_all(url: str, timeout_s: float, only: list[str] | None) -> list[Outcome]:
    outcomes = []
    for case, request, action in cases(url):
        if only and not any(case.startswith(o) for o in only):
            continue
        outcomes.append(await measure(url, case, request, action, timeout_s))
        print(format_row(outcomes[-1]), flush=True)
        await asyncio.sleep(1.0)  # let the server settle between cases
    return outcomes


def format_row(o: Outcome) -> str:
    return (
        f"| {o.case} | {o.request} | {o.status} | {o.response_bytes:,} B | {o.seconds:.2f} s "
        f"| {o.slowest_health_s * 1000:.0f} ms |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hostile", description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="a running server (default: start `app.py serve`)")
    parser.add_argument("--model", default=None, help="model for the started server (default: SmolLM2-135M)")
    parser.add_argument("--timeout", type=float, default=60.0, help="client timeout per case (s)")
    parser.add_argument("--only", nargs="*", default=None, help="cases whose name starts with these")
    args = parser.parse_args(argv)
    print("| class | request | status | response | time | slowest /health |\n|---|---|---|---|---|---|")
    with ServerUnderTest(args.base_url, args.model, SERVER_ARGS) as server:
        asyncio.run(run_all(server.url, args.timeout, args.only))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
