"""A Chat reply beside busy neighbours: the serving engine's fitted thread count against a fixed one.

    python -m benchmarks.shared_cores [--model M] [--tokens 256] [--repeats 3] [--neighbours 1]

Each (mode, repeat) runs in its own process, the modes interleaved: "fixed" keeps the threads the engine
starts with, "fitted" fits them to the cores other processes leave free (backend/engine/compute_threads.py,
what the server and the app do). In each process one greedy reply of --tokens tokens streams through
AsyncLLM, as the Chat tab's does: first on the quiet machine, then while --neighbours processes each spin a
core (a browser rendering the reply, a client, another job). Printed: decode tok/s (first token to last),
the threads the engine ended on, and fitted / fixed per condition (medians over the repeats).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

from benchmarks.child_runs import answered_as_child, parent_argv
from benchmarks.child_runs import run_child as run_variant

MODES = ("fixed", "fitted")
CONDITIONS = ("quiet", "busy")
PROMPT = "Write a long story about a dragon who learns to cook."


@contextmanager
def busy_neighbours(count: int):
    """count processes that each spin one core until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)  # they are running before the reply starts
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


async def reply_tok_s(async_llm, ids: list[int], tokens: int) -> float:
    """Decode tok/s of one streamed greedy reply: tokens after the first over the time they took."""
    from backend.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    first = last = None
    count = 0
    async for out in async_llm.generate(ids, params):
        now, count = time.perf_counter(), len(out.outputs[0].token_ids)
        first = now if first is None else first
        last = now
    assert first is not None and last is not None and count == tokens
    return (count - 1) / (last - first)


def run_child(args: argparse.Namespace) -> dict:
    from backend.default_model import default_model
    from backend.engine import AsyncLLM
    from backend.engine.config import EngineConfig

    config = EngineConfig(args.model or default_model(check_hub=False))
    async_llm = AsyncLLM.from_config(config, adapt_threads=args.child == "fitted")
    ids = async_llm.llm.chat_prompt([{"role": "user", "content": PROMPT}])
    result: dict = {}
    try:
        asyncio.run(reply_tok_s(async_llm, ids, 16))  # warm-up, untimed
        for condition in CONDITIONS:
            with busy_neighbours(args.neighbours if condition == "busy" else 0):
                tok_s = asyncio.run(reply_tok_s(async_llm, ids, args.tokens))
            result[condition] = {"tok_s": tok_s, "threads": async_llm.stats().compute_threads}
    finally:
        async_llm.shutdown()
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model folder, GGUF file or Hub id (default model)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens in each reply")
    parser.add_argument("--repeats", type=int, default=3, help="processes per mode, interleaved")
    parser.add_argument("--neighbours", type=int, default=1, help="processes spinning a core each")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if answered_as_child(args, run_child):
        return 0
    print(f"{args.tokens}-token greedy replies; busy = {args.neighbours} process(es) spinning a core each")
    base = parent_argv(argv)
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    print("| repeat | mode | quiet tok/s | threads | busy tok/s | threads |")
    print("|---|---|---|---|---|---|")
    for repeat in range(args.repeats):
        for mode in MODES:
            result = run_variant("benchmarks.shared_cores", base, mode)
            runs[mode].append(result)
            cells = [f"{result[c]['tok_s']:.1f} | {result[c]['threads']}" for c in CONDITIONS]
            print(f"| {repeat + 1} | {mode} | " + " | ".join(cells) + " |", flush=True)
    for condition in CONDITIONS:
        medians = {m: statistics.median(r[condition]["tok_s"] for r in runs[m]) for m in MODES}
        print(
            f"{condition}: fixed {medians['fixed']:.1f} tok/s, fitted {medians['fitted']:.1f} tok/s "
            f"(fitted / fixed {medians['fitted'] / medians['fixed']:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
