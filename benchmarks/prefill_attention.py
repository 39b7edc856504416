"""Prefill speed of the engine with its native prefill attention and with PyTorch's, in one process.

    python -m benchmarks.prefill_attention                       # the dense default model, 16 x 256 tokens
    python -m benchmarks.prefill_attention --model DIR --prompts 16 --prompt-len 256 --rounds 4

Rounds alternate the two paths on one loaded engine (ModelRunner.prefill_kernel switched between rounds,
as PLAYGROUND_PREFILL_ATTENTION=0 sets it at start): each round adds --prompts random prompts at once with
max_tokens=1, so the engine only prefills (steps of up to --max-num-batched-tokens tokens). Prints prompt
tokens/s per round and the ratio of the medians (issue 19's TTFT at concurrency 16 waits on this).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path

from backend.bench.machine import cpu_summary

DENSE_MODEL = Path.home() / ".cache" / "llm-playground" / "model-dense"  # the default model in bf16


def prefill_round(engine, tokens: list[list[int]], tag: str) -> tuple[float, list[float]]:
    """Prompt tokens/s of prefilling tokens at once, and each step's seconds."""
    from backend.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    for i, prompt in enumerate(tokens):
        engine.add_request(f"{tag}-{i}", prompt, params)
    start, steps = time.perf_counter(), []
    while engine.has_unfinished_requests():
        step_start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - step_start)
    return sum(map(len, tokens)) / (time.perf_counter() - start), steps


def main(args: argparse.Namespace) -> int:
    from backend.engine import LLM

    llm = LLM(args.model, max_num_batched_tokens=args.max_num_batched_tokens)
    engine = llm.llm_engine
    if not engine.runner.prefill_kernel:
        print(
            "the native prefill attention is not in use here (no kernels, or PLAYGROUND_PREFILL_ATTENTION=0)"
        )
        return 1
    print(cpu_summary())
    rng = random.Random(0)
    vocab = engine.runner.model.args.vocab_size
    rates: dict[bool, list[float]] = {True: [], False: []}
    prefill_round(engine, [[rng.randrange(100, vocab) for _ in range(args.prompt_len)]], "warm-up")
    for round_index in range(args.rounds):
        for native in (True, False) if round_index % 2 == 0 else (False, True):
            engine.runner.prefill_kernel = native
            tokens = [
                [rng.randrange(100, vocab) for _ in range(args.prompt_len)] for _ in range(args.prompts)
            ]
            rate, steps = prefill_round(engine, tokens, f"{round_index}-{native}")
            rates[native].append(rate)
            label, seconds = "native" if native else "torch ", [round(s, 3) for s in steps]
            load = os.getloadavg()[0]
            print(
                f"round {round_index} {label}: {rate:7.0f} prompt tok/s; steps {seconds} s; load {load:.2f}"
            )
    native_rate, torch_rate = statistics.median(rates[True]), statistics.median(rates[False])
    ratio = native_rate / torch_rate
    print(f"median prompt tok/s: native {native_rate:.0f}, torch {torch_rate:.0f}; ratio {ratio:.2f}x")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--model", default=str(DENSE_MODEL))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each path, interleaved")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main(parse_args()))
