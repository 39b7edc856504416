"""The first burst of a served run as a timeline: where each of its first tokens waited.

    python -m benchmarks.burst_timeline --model DIR --num-prompts 32 --max-concurrency 16

The real server runs in this process (AsyncLLM.from_config + build_app under uvicorn, as `app.py serve`),
`python app.py bench` drives it from another (random prompts, ignore_eos, after an untimed warm-up with
other prompts). A BurstProbe (burst_probe.py) records, for each of the first --max-concurrency requests
(sent at once by the client), its arrival at the server, admission (tokenized), hand-over to the engine,
first scheduled step, first token and first chunk with text, and every engine step until the last of
them (decode rows, prefill tokens, ms). The summary sets the k-th first token beside the prefill tokens
computed before it at the burst's best prefill-only rate: what a step holding nothing but prefill
arithmetic would have taken.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

from backend.export.supervisor import free_port
from benchmarks import served_steps
from benchmarks.burst_probe import BurstProbe, RequestTimes
from benchmarks.step_recorder import StepRecord


def client_command(args: argparse.Namespace, port: int, out: Path, warm_up: bool) -> list[str]:
    """The measured load, or the untimed warm-up before it (8 prompts of another seed)."""
    if warm_up:
        args = argparse.Namespace(
            **vars(args) | {"num_prompts": min(8, args.num_prompts), "seed": args.seed + 1000}
        )
    return served_steps.client_command(args, port, out, served_name="burst")


async def serve_and_load(async_llm, probe: BurstProbe, args: argparse.Namespace) -> dict:
    """Serve async_llm while the client runs a warm-up, then the measured load; the client's result."""
    import uvicorn

    from backend.server.app import build_app

    port = free_port()
    app = probe.wrap_app(build_app(lambda: async_llm, served_model_name="burst"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    result: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        for warm_up in (True, False):
            out = Path(folder) / "result.json"
            probe.take()
            client = await asyncio.create_subprocess_exec(
                *client_command(args, port, out, warm_up),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await client.wait()
            result = json.loads(out.read_text()) if out.exists() else {}
    server.should_exit = True
    await task
    return result


def ms(t: float | None, t0: float) -> str:
    return "-" if t is None else f"{(t - t0) * 1e3:,.0f}"


def prefill_before(steps: list[StepRecord], t: float) -> int:
    """Prompt tokens computed by the steps up to the one that sampled a token at t (stamped inside it)."""
    return sum(s.num_prefill_tokens for s in steps if s.started <= t)


def request_table(burst: list[RequestTimes], steps: list[StepRecord], t0: float) -> list[str]:
    lines = [
        "| # | arrived | admitted | handed | scheduled | first token | first chunk | TTFT | prefill before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    by_token = sorted(burst, key=lambda r: r.first_token or float("inf"))
    for k, r in enumerate(by_token, 1):
        ttft = "-" if r.first_chunk is None else f"{(r.first_chunk - r.arrived) * 1e3:,.0f}"
        cells = [ms(r.arrived, t0), ms(r.admitted, t0), ms(r.handed, t0), ms(r.first_scheduled, t0)]
        cells += [ms(r.first_token, t0), ms(r.first_chunk, t0), ttft]
        cells.append(f"{prefill_before(steps, r.first_token):,}" if r.first_token else "-")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return lines


def step_table(steps: list[StepRecord], t0: float) -> list[str]:
    lines = [
        "| step | start | decode rows | prefill tokens | ms | ms / 1k tokens | gap ms | page faults |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, s in enumerate(steps, 1):
        tokens = s.num_decode_rows + s.num_prefill_tokens
        cells = [
            ms(s.started, t0),
            str(s.num_decode_rows),
            str(s.num_prefill_tokens),
            f"{s.seconds * 1e3:,.0f}",
        ]
        cells += [f"{s.seconds * 1e6 / tokens:,.0f}", f"{s.gap_seconds * 1e3:.1f}", f"{s.minor_faults:,}"]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    return lines


def group_line(name: str, group: list[StepRecord]) -> str:
    tokens, seconds = sum(s.num_prefill_tokens for s in group), sum(s.seconds for s in group)
    rows = sum(s.num_decode_rows for s in group)
    rate = tokens / seconds if seconds else 0.0
    return (
        f"{name} steps: {len(group)}, {tokens:,} prefill tokens + {rows} decode rows in "
        f"{seconds * 1e3:,.0f} ms ({rate:,.0f} prefill tok/s)"
    )


def summary(burst: list[RequestTimes], steps: list[StepRecord], t0: float, client: dict) -> list[str]:
    """Where the burst's first tokens waited, and the prefill-arithmetic floor for each."""
    firsts = sorted(r.first_token for r in burst if r.first_token is not None)
    if not firsts or not steps:
        return ["no first token recorded"]
    prefill_only = [s for s in steps if s.num_decode_rows == 0 and s.num_prefill_tokens]
    mixed = [s for s in steps if s.num_decode_rows and s.num_prefill_tokens]
    last_arrival, last_handed = max(r.arrived for r in burst), max(r.handed or 0.0 for r in burst)
    busy, gaps = sum(s.seconds for s in steps), sum(s.gap_seconds for s in steps)
    lines = [
        f"first step starts {ms(steps[0].started, t0)} ms after the first arrival; last arrival "
        f"{ms(last_arrival, t0)} ms, last hand-over {ms(last_handed, t0)} ms",
        f"steps until the last first token: {len(steps)}, busy {busy * 1e3:,.0f} ms, "
        f"gaps between them {gaps * 1e3:,.0f} ms, minor page faults {sum(s.minor_faults for s in steps):,}",
    ]
    lines += [
        group_line(name, group) for name, group in (("prefill-only", prefill_only), ("mixed", mixed)) if group
    ]
    largest = max(s.num_prefill_tokens for s in steps)
    rate = max(s.num_prefill_tokens / s.seconds for s in steps if 2 * s.num_prefill_tokens >= largest)
    if rate:
        lines.append(
            f"the k-th first token against its prefill at the best full step's {rate:,.0f} prefill tok/s:"
        )
        for k in sorted({max(1, len(firsts) - 2), len(firsts)}):
            t = firsts[k - 1]
            floor = prefill_before(steps, t) / rate
            lines.append(
                f"  {k}: {ms(t, t0)} ms; prefill floor {floor * 1e3:,.0f} ms ({floor / (t - t0):.0%})"
            )
    ttfts = sorted(client.get("ttfts", []), reverse=True)
    if ttfts:
        top = ", ".join(f"{t * 1e3:,.0f}" for t in ttfts[:3])
        lines.append(
            f"client: TTFT p99 {client.get('p99_ttft_ms', float('nan')):,.0f} ms, largest three {top} ms"
        )
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a local model folder (its tokenizer too)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-concurrency", type=int, default=16, help="also the burst's size")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="engine's (default: its own)"
    )
    parser.add_argument("--block-size", type=int, default=32, help="compare's (vLLM CPU's multiple of 32)")
    parser.add_argument("--seed", type=int, default=0, help="prompt seed (the warm-up uses seed + 1000)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from backend.bench.machine import cpu_summary
    from backend.engine import AsyncLLM
    from backend.engine.config import EngineConfig

    kwargs = {"block_size": args.block_size, "max_num_seqs": args.max_concurrency}
    if args.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    config = EngineConfig(args.model, **kwargs)
    async_llm = AsyncLLM.from_config(config)
    probe = BurstProbe()
    probe.attach(async_llm)
    try:
        client = asyncio.run(serve_and_load(async_llm, probe, args))
    finally:
        async_llm.shutdown()
    requests, steps = probe.take()
    burst = requests[: args.max_concurrency]
    if not burst:
        print("no request reached the server")
        return 1
    t0 = burst[0].arrived
    last = max((r.first_token or 0.0) for r in burst)
    steps = [s for s in steps if s.started <= last]
    print(cpu_summary())
    budget, load = config.max_num_batched_tokens, os.getloadavg()[0]
    print(f"config: max_num_batched_tokens {budget}, load average {load:.2f}")
    print(f"burst of {len(burst)} ({args.input_len}-token prompts); times in ms after its first arrival\n")
    print("\n".join(request_table(burst, steps, t0)) + "\n")
    print("\n".join(step_table(steps, t0)) + "\n")
    print("\n".join(summary(burst, steps, t0, client)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
