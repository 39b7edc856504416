"""Where one decode step goes: a batch of sequences decoding together, per op and per part of the step.

    python -m benchmarks.step_profile                          # 64 sequences, 128-token prompts, bf16
    python -m benchmarks.step_profile --model DIR --num-seqs 32 --steps 20 --top 25
    python -m benchmarks.step_profile --model DIR --compare-gemm   # oneDNN vs gemm_bf16, interleaved
    python -m benchmarks.step_profile --model DIR --prefill-tokens 2048 --prompt-len 256   # prefill steps

Prefills the batch, then times decode steps (the median of --steps, after two untimed ones), splits one
step into its parts (host-side inputs, the forward pass, sampling, the engine's bookkeeping) with our own
timers, and prints torch.profiler's per-op table over --profile-steps steps. The CPU model, its flags and
the kernels the engine picked are printed with every figure (the same step is 3x apart between CPUs).
--compare-gemm instead runs two engines side by side in one process, one on oneDNN's packed GEMM
(PLAYGROUND_GEMM_BF16=0), one on the native bf16 GEMM, and alternates their decode steps (with
--prefill-tokens, their prefill steps); --compare-eager the same with enforce_eager against the captured
decode steps (decode_graph.py). --prefill-tokens N profiles prefill steps instead: each step is
N / --prompt-len fresh random prompts prefilled together (max_tokens 1, so every step is all prefill).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

from backend.bench.machine import cpu_summary
from benchmarks.step_parts import PartTimer, label_kernels


def start_batch(llm, num_seqs: int, prompt_len: int) -> None:
    """Add num_seqs requests with distinct random prompts and step until every one is decoding."""
    import random

    from backend.engine import SamplingParams

    engine = llm.llm_engine
    rng = random.Random(0)
    vocab = engine.runner.model.args.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    for i in range(num_seqs):
        engine.add_request(f"profile-{i}", [rng.randrange(100, vocab) for _ in range(prompt_len)], params)
    while any(seq.num_output_tokens == 0 for r in engine.requests.values() for seq in r.seqs):
        engine.step()


class PrefillFeed:
    """Before each step, adds prefill_tokens / prompt_len fresh random prompts (max_tokens 1), so that every
    step is a prefill of exactly prefill_tokens tokens whose requests finish in it."""

    def __init__(self, engine, prefill_tokens: int, prompt_len: int) -> None:
        import random

        from backend.engine import SamplingParams

        self.engine, self.prompts, self.prompt_len = engine, max(1, prefill_tokens // prompt_len), prompt_len
        self.rng, self.count = random.Random(0), 0
        self.params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    def __call__(self) -> None:
        vocab = self.engine.runner.model.args.vocab_size
        for _ in range(self.prompts):
            prompt = [self.rng.randrange(100, vocab) for _ in range(self.prompt_len)]
            self.engine.add_request(f"prefill-{self.count}", prompt, self.params)
            self.count += 1


def time_steps(
    engine, steps: int, feed: PrefillFeed | None = None, warmup: int = 2
) -> tuple[list[float], list[float]]:
    """Wall and process CPU seconds of each of steps steps, after warmup untimed ones (feed adds a prefill
    step's prompts before each, untimed). The CPU time is the steadier figure on a shared machine (it
    excludes time other processes held the cores)."""
    wall, cpu = [], []
    for step in range(steps + warmup):
        if feed is not None:
            feed()
        start, start_cpu = time.perf_counter(), time.process_time()
        engine.step()
        if step >= warmup:
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def start_engine(args: argparse.Namespace, model: str, **engine_kwargs):
    """(engine, feed): an engine whose every step is the profiled one (a decode step of --num-seqs
    sequences, or a prefill of --prefill-tokens), and what to call before each step."""
    from backend.engine import LLM

    batched = max(args.batched_tokens, args.prefill_tokens)
    llm = LLM(
        model, dtype=args.dtype, max_num_seqs=args.num_seqs, max_num_batched_tokens=batched, **engine_kwargs
    )
    if args.prefill_tokens:
        return llm.llm_engine, PrefillFeed(llm.llm_engine, args.prefill_tokens, args.prompt_len)
    start_batch(llm, args.num_seqs, args.prompt_len)
    return llm.llm_engine, None


def step_name(args: argparse.Namespace) -> tuple[str, int]:
    """What one profiled step is, and the tokens it computes."""
    if args.prefill_tokens:
        prompts = max(1, args.prefill_tokens // args.prompt_len)
        tokens = prompts * args.prompt_len
        return f"{tokens}-token prefill step ({prompts} prompts x {args.prompt_len})", tokens
    return f"{args.num_seqs}-sequence decode step", args.num_seqs


# --compare-gemm / --compare-eager: two engines, (environment set while each loads, LLM keyword arguments)
COMPARISONS: dict[str, dict[str, tuple[dict, dict]]] = {
    "gemm": {"oneDNN": ({"PLAYGROUND_GEMM_BF16": "0"}, {}), "gemm_bf16": ({"PLAYGROUND_GEMM_BF16": "1"}, {})},
    "eager": {"enforce_eager": ({}, {"enforce_eager": True}), "captured": ({}, {})},
}


def compare(args: argparse.Namespace, model: str, variants: dict[str, tuple[dict, dict]]) -> int:
    """Steps of two engines alternated step by step (one load each); the second's speed-up is printed."""
    engines = {}
    for label, (environment, engine_kwargs) in variants.items():
        os.environ.update(environment)  # read when the model is prepared
        engines[label] = start_engine(args, model, **engine_kwargs)
        for name in environment:
            del os.environ[name]
    times: dict[str, list[float]] = {label: [] for label in engines}
    cpu: dict[str, list[float]] = {label: [] for label in engines}
    for step in range(args.steps + 2):  # two untimed steps each, then one timed step each in turn
        for label, (engine, feed) in engines.items():
            wall, cpu_time = time_steps(engine, int(step >= 2), feed, warmup=int(step < 2))
            times[label] += wall
            cpu[label] += cpu_time
    medians = {label: statistics.median(t) for label, t in times.items()}
    name, tokens = step_name(args)
    print(f"\n{name}, {args.steps} steps each, alternated")
    for label, t in times.items():
        median, rate = medians[label] * 1e3, tokens / medians[label]
        print(f"  {label:<14} median {median:7.1f} ms ({rate:5.0f} tok/s), min {min(t) * 1e3:7.1f} ms, "
              f"CPU time {statistics.median(cpu[label]) * 1e3:7.1f} ms")  # fmt: skip
    first, second = variants
    print(f"  {second} / {first}: {medians[first] / medians[second]:.2f}x (medians); "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    return 0


def main(args: argparse.Namespace) -> int:
    import torch

    from backend.default_model import default_model

    model = args.model or default_model()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"model {model}, dtype {args.dtype}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(cpu_summary(), flush=True)
    if args.compare_gemm or args.compare_eager:
        return compare(args, model, COMPARISONS["gemm" if args.compare_gemm else "eager"])
    engine, feed = start_engine(args, model)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times, cpu = time_steps(engine, args.steps, feed)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / (args.steps + 2)
    step, (name, tokens) = statistics.median(times), step_name(args)
    print(f"\n{name}: median {step * 1e3:.1f} ms over {len(times)} steps, "
          f"{tokens / step:.0f} tok/s (min {min(times) * 1e3:.1f} ms); CPU time per step "
          f"{statistics.median(cpu) * 1e3:.1f} ms over {torch.get_num_threads()} threads; "
          f"{faults:.0f} minor page faults a step (first writes to KV-pool pages among them)")  # fmt: skip
    parts = PartTimer(engine)
    rounds = 5
    time_steps(engine, rounds, feed)
    print(f"\nParts of a step (our timers, mean of {rounds + 2} steps)")
    for label, total in sorted(parts.totals.items(), key=lambda kv: -kv[1]):
        print(f"  {label:<40} {total / (rounds + 2) * 1e3:8.2f} ms")
    label_kernels()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(args.profile_steps):
            if feed is not None:
                feed()
            engine.step()
    print(f"\ntorch.profiler, {args.profile_steps} steps (times are totals over them)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
    for request_id in list(engine.requests):
        engine.abort_request(request_id)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder or GGUF file (default model)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--num-seqs", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--batched-tokens", type=int, default=2048, help="max_num_batched_tokens")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--top", type=int, default=25, help="rows of the per-op table")
    parser.add_argument("--compare-gemm", action="store_true", help="oneDNN vs gemm_bf16 engines, alternated")
    parser.add_argument(
        "--compare-eager", action="store_true", help="enforce_eager vs captured decode steps, alternated"
    )
    parser.add_argument(
        "--prefill-tokens", type=int, default=0, help="profile prefill steps of this many tokens instead"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
