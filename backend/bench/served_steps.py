"""Engine steps served over HTTP against the same engine stepping offline, at the same concurrency.

    python -m backend.bench.served_steps --model DIR --num-prompts 64 --max-concurrency 16

One process loads the engine once, then (1) steps it offline, keeping --max-concurrency requests in
flight (a new one is added as one finishes, as a client would), and (2) serves it with the real
server (`AsyncLLM` + `build_app` under uvicorn) while `python app.py bench` loads it from a separate
process. Every step is recorded (wall time, decode rows, prefill tokens, the gap since the previous
step) by wrapping the engine's step(); steps are compared by their batch composition, so a served
decode step of 16 rows is set beside an offline one of 16 rows. The two passes use different prompt
seeds so that the second is not served from the first's prefix cache.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(slots=True)
class StepRecord:
    seconds: float
    gap_seconds: float  # engine-thread time since the previous step ended (commands, delivery, waiting)
    num_decode_rows: int
    num_prefill_tokens: int


@dataclass(slots=True)
class StepRecorder:
    """Wraps an LLMEngine's step() and scheduler.schedule() to record each step's time and batch."""

    records: list[StepRecord] = field(default_factory=list)
    _last_end: float | None = None
    _batch: tuple[int, int] = (0, 0)

    def attach(self, engine) -> None:
        step, schedule = engine.step, engine.scheduler.schedule

        def recorded_schedule():
            scheduled = schedule()
            decodes = sum(1 for item in scheduled if item.seq.num_uncomputed_tokens == 1)
            prefill = sum(item.num_new_tokens for item in scheduled if item.seq.num_uncomputed_tokens > 1)
            self._batch = (decodes, prefill)
            return scheduled

        def recorded_step():
            start = time.perf_counter()
            self._batch = (0, 0)
            outputs = step()
            end = time.perf_counter()
            if self._batch != (0, 0):
                gap = start - self._last_end if self._last_end is not None else 0.0
                self.records.append(StepRecord(end - start, gap, *self._batch))
            self._last_end = end
            return outputs

        engine.scheduler.schedule = recorded_schedule
        engine.step = recorded_step

    def take(self) -> list[StepRecord]:
        records, self.records, self._last_end = self.records, [], None
        return records


def offline_pass(llm, prompts: list[list[int]], output_len: int, concurrency: int) -> float:
    """Keep `concurrency` requests in flight until all prompts are done; returns the wall time."""
    from backend.engine import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    pending = list(enumerate(prompts))
    start, in_flight = time.perf_counter(), 0
    while pending or in_flight:
        while pending and in_flight < concurrency:
            i, ids = pending.pop(0)
            engine.add_request(f"offline-{i}", ids, params)
            in_flight += 1
        for out in engine.step():
            in_flight -= out.finished
    return time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def served_pass(llm, args: argparse.Namespace, seed: int) -> tuple[float, str]:
    """Serve llm on a free port while `app.py bench` loads it; returns (wall time, the client's report)."""
    import uvicorn

    from backend.engine import AsyncLLM
    from backend.server.app import build_app

    engine = AsyncLLM(llm)
    port = free_port()
    app = build_app(lambda: engine, served_model_name="served-steps")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    command = [sys.executable, str(REPO_ROOT / "app.py"), "bench", "--base-url", f"http://127.0.0.1:{port}/v1"]
    command += ["--model", "served-steps", "--tokenizer", args.model, "--dataset", "random"]
    command += ["--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.max_concurrency)]
    command += ["--input-len", str(args.input_len), "--output-len", str(args.output_len)]
    command += ["--ignore-eos", "--seed", str(seed)]
    start = time.perf_counter()
    client = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE, cwd=REPO_ROOT)
    report, _ = await client.communicate()
    seconds = time.perf_counter() - start
    server.should_exit = True
    await task
    engine.shutdown()
    return seconds, report.decode()


def bench_prompts(args: argparse.Namespace, seed: int) -> list[list[int]]:
    """The token ids of the prompts `app.py bench --dataset random --seed seed` sends."""
    from backend.bench.datasets import iter_requests
    from backend.bench.serve import BenchConfig

    config = BenchConfig("", "", num_prompts=args.num_prompts, input_len=args.input_len, seed=seed)
    config = replace(config, output_len=args.output_len, tokenizer=args.model)
    from backend.bench.datasets import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    return [list(tokenizer(req.prompt)["input_ids"]) for req in iter_requests(config)]


def summarize(name: str, records: list[StepRecord], seconds: float) -> dict[int, float]:
    """Print one pass's steps; returns the median ms of pure-decode steps by number of rows."""
    tokens = sum(r.num_decode_rows for r in records) + sum(1 for r in records if r.num_prefill_tokens)
    busy = sum(r.seconds for r in records)
    print(f"{name}: {len(records)} steps in {seconds:.1f} s ({len(records) / seconds:.1f} steps/s), "
          f"engine busy {busy / seconds:.0%}, ~{tokens / seconds:.1f} out tok/s")
    decode_ms: dict[int, float] = {}
    by_rows: dict[int, list[StepRecord]] = {}
    for r in records:
        if r.num_prefill_tokens == 0:
            by_rows.setdefault(r.num_decode_rows, []).append(r)
    for rows, group in sorted(by_rows.items()):
        if len(group) >= 5:
            decode_ms[rows] = statistics.median(r.seconds for r in group) * 1e3
    mixed = [r for r in records if r.num_prefill_tokens]
    gaps = [r.gap_seconds * 1e3 for r in records[1:]]
    print(f"  decode-only steps, median ms by rows: "
          + ", ".join(f"{rows}: {ms:.1f}" for rows, ms in decode_ms.items()))
    if mixed:
        print(f"  steps with prefill: {len(mixed)}, median {statistics.median(r.seconds for r in mixed) * 1e3:.0f} ms, "
              f"median prefill tokens {statistics.median(r.num_prefill_tokens for r in mixed):.0f}")
    if gaps:
        print(f"  gap between steps: median {statistics.median(gaps):.2f} ms, mean {statistics.fmean(gaps):.2f} ms")
    return decode_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a local model folder (its tokenizer too)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None, help="engine's (default: its own)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()

    from backend.bench.step_profile import cpu_summary
    from backend.engine import LLM

    kwargs = {"block_size": args.block_size}
    if args.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    llm = LLM(args.model, **kwargs)
    print(cpu_summary())
    print(f"load average before: {os.getloadavg()}")
    recorder = StepRecorder()
    recorder.attach(llm.llm_engine)
    offline_pass(llm, bench_prompts(args, args.seed + 1000)[:16], 8, args.max_concurrency)  # warm-up
    recorder.take()
    seconds = offline_pass(llm, bench_prompts(args, args.seed + 1), args.output_len, args.max_concurrency)
    offline = summarize("offline", recorder.take(), seconds)
    seconds, report = asyncio.run(served_pass(llm, args, args.seed))
    served = summarize("served", recorder.take(), seconds)
    print(f"load average after: {os.getloadavg()}")
    for rows in sorted(set(offline) & set(served)):
        print(f"  {rows} decode rows: served / offline step time = {served[rows] / offline[rows]:.2f}x")
    print("--- the client's report (app.py bench) ---")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
