"""Engine steps served over HTTP against the same engine stepping offline, at the same concurrency.

    python -m benchmarks.served_steps --model DIR --num-prompts 64 --max-concurrency 16

Each variant runs in its own process, the variants interleaved over --rounds: "offline" steps the engine,
keeping --max-concurrency requests in flight (a new one is added as one finishes, as a client would);
"served" serves it with the real server (`AsyncLLM.from_config` + `build_app` under uvicorn) while
`python app.py bench` loads it from a separate process; "served-main-load" serves an engine loaded on the
main thread and stepped on another (two OpenMP pools, the layout before); "served-fixed-threads" serves
without fitting its thread count to the client's load (backend/engine/compute_threads.py). Every step
is recorded (wall time, decode rows, prefill tokens, the gap since the previous step) by a StepRecorder
(benchmarks/step_recorder.py); steps are compared by their batch composition, so a served decode step
of 16 rows is set beside an offline one of 16 rows. The offline warm-up uses another prompt seed so that
the measured pass is not served from its prefix cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from backend.export.supervisor import free_port
from benchmarks.child_runs import answered_as_child, parent_argv
from benchmarks.child_runs import run_child as run_variant
from benchmarks.step_recorder import StepRecorder, step_summary, voluntary_switches

if TYPE_CHECKING:
    from backend.engine.compute_threads import ComputeThreads

REPO_ROOT = Path(__file__).resolve().parents[1]


def offline_pass(engine, prompts: list[list[int]], output_len: int, concurrency: int) -> float:
    """Keep `concurrency` requests in flight until all prompts are done; returns the wall time."""
    from backend.engine import SamplingParams

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


def client_command(
    args: argparse.Namespace, port: int, out: Path, served_name: str = "served-steps"
) -> list[str]:
    """`app.py bench` with args' random workload (model, prompts, concurrency, lengths, seed), ignore_eos."""
    command = [
        sys.executable,
        str(REPO_ROOT / "app.py"),
        "bench",
        "--base-url",
        f"http://127.0.0.1:{port}/v1",
    ]
    command += ["--model", served_name, "--tokenizer", args.model, "--dataset", "random"]
    command += ["--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.max_concurrency)]
    command += ["--input-len", str(args.input_len), "--output-len", str(args.output_len)]
    return [*command, "--ignore-eos", "--seed", str(args.seed), "--out", str(out)]


async def served_pass(engine, args: argparse.Namespace, recorder: StepRecorder) -> tuple[float, dict]:
    """Serve engine (an AsyncLLM) while `app.py bench` loads it; returns (wall time, the client's result)."""
    import uvicorn

    from backend.server.app import build_app

    port = free_port()
    app = build_app(lambda: engine, served_model_name="served-steps")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        client = await asyncio.create_subprocess_exec(
            *client_command(args, port, out),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        recorder.take()  # steps start with the client's first request
        start = time.perf_counter()
        await client.wait()
        seconds = time.perf_counter() - start
        result = json.loads(out.read_text()) if out.exists() else {}
    server.should_exit = True
    await task
    return seconds, result


def bench_prompts(args: argparse.Namespace, seed: int) -> list[list[int]]:
    """The token ids of the prompts `app.py bench --dataset random --seed seed` sends."""
    from backend.bench.datasets import iter_requests, load_tokenizer
    from backend.bench.serve import BenchConfig

    config = BenchConfig("", "", num_prompts=args.num_prompts, input_len=args.input_len, seed=seed)
    config = replace(config, output_len=args.output_len, tokenizer=args.model)
    tokenizer = load_tokenizer(args.model)
    return [list(tokenizer(req.prompt)["input_ids"]) for req in iter_requests(config)]


def run_child(args: argparse.Namespace) -> dict:
    """One variant in this process: offline, served (loaded on the stepping thread) or served-main-load."""
    from backend.engine import LLM, AsyncLLM
    from backend.engine.config import EngineConfig

    kwargs = {"block_size": args.block_size}
    if args.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    config = EngineConfig(args.model, **kwargs)
    recorder = StepRecorder()
    if args.child == "offline":
        engine = LLM(**asdict(config)).llm_engine
        recorder.attach(engine)
        offline_pass(engine, bench_prompts(args, args.seed + 1000)[:4], 4, args.max_concurrency)  # warm-up
        recorder.take()
        switches = voluntary_switches()
        seconds = offline_pass(engine, bench_prompts(args, args.seed), args.output_len, args.max_concurrency)
        return {"steps": step_summary(recorder.take(), seconds, voluntary_switches() - switches)}
    # served-main-load: the layout before, loaded on the main thread and stepped on another (two pools);
    # served-fixed-threads: on the stepping thread, keeping its thread count while the client runs
    if args.child == "served-main-load":
        async_llm = AsyncLLM(LLM(**asdict(config)))
    else:
        async_llm = AsyncLLM.from_config(config, adapt_threads=args.child == "served")
    recorder.attach(async_llm.engine)
    switches = voluntary_switches()
    seconds, result = asyncio.run(served_pass(async_llm, args, recorder))
    steps = step_summary(recorder.take(), seconds, voluntary_switches() - switches)
    keys = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms")
    threads = async_llm.compute_threads
    async_llm.shutdown()
    client = {key: result.get(key) for key in keys}
    return {"steps": steps, "client": client, "threads": asdict_threads(threads)}


def asdict_threads(threads: ComputeThreads | None) -> dict:
    """What the thread fitting did over a served pass (empty when it did not run)."""
    if threads is None:
        return {}
    return {"final": threads.threads, "changes": threads.num_changes, "others": round(threads.others, 2)}


VARIANTS = ("offline", "served", "served-fixed-threads", "served-main-load")
COLUMNS = (  # (header, section, key, format)
    ("step ms", "steps", "decode_step_ms", "{:.1f}"),
    ("mixed ms", "steps", "mixed_step_ms", "{:.0f}"),
    ("steps/s", "steps", "steps_per_s", "{:.1f}"),
    ("busy", "steps", "busy", "{:.0%}"),
    ("gap ms", "steps", "gap_ms", "{:.2f}"),
    ("switches/step", "steps", "switches_per_step", "{:.0f}"),
    ("out tok/s", "client", "output_throughput", "{:.1f}"),
    ("TTFT p50", "client", "median_ttft_ms", "{:.0f}"),
    ("TTFT p99", "client", "p99_ttft_ms", "{:.0f}"),
    ("TPOT p50", "client", "median_tpot_ms", "{:.1f}"),
    ("ITL p50", "client", "median_itl_ms", "{:.1f}"),
    ("threads", "threads", "final", "{}"),  # the served engine's CPU threads at the end (compute_threads.py)
    ("thread changes", "threads", "changes", "{}"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a local model folder (its tokenizer too)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="engine's (default: its own)"
    )
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=5, help="prompt seed, the same for every variant")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds of all variants")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def row(variant: str, result: dict, load: float) -> str:
    cells = []
    for _, section, key, fmt in COLUMNS:
        value = result.get(section, {}).get(key)
        cells.append(fmt.format(value) if isinstance(value, float | int) else "-")
    return f"| {variant} | " + " | ".join(cells) + f" | {load:.2f} |"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if answered_as_child(args, run_child):
        return 0
    print(
        f"{args.num_prompts} prompts of {args.input_len} tokens, {args.output_len} out, concurrency "
        f"{args.max_concurrency}; each variant in its own process, {args.rounds} interleaved round(s)"
    )
    print("| variant | " + " | ".join(c[0] for c in COLUMNS) + " | load avg |")
    print("|---" * (len(COLUMNS) + 2) + "|")
    base = parent_argv(argv)
    for _ in range(args.rounds):
        for variant in args.variants:
            try:
                result = run_variant("benchmarks.served_steps", base, variant)
            except RuntimeError as exc:
                print(f"| {variant} | {exc} |")
                continue
            print(row(variant, result, os.getloadavg()[0]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
