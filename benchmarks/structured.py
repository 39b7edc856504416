"""Structured-output overhead: the same prompts decoded with and without a JSON schema, side by side.

    python -m benchmarks.structured                          # batch 1 and 16, 64 tokens, 3 rounds
    python -m benchmarks.structured --batch-sizes 16 --max-tokens 128 --no-interleave

The schema (a list of at least 1000 nested objects with enums, arrays and required fields) cannot be
completed within max_tokens, so constrained and free runs generate exactly the same number of tokens.
Rounds alternate free / constrained runs (interleaved) unless --no-interleave runs each mode's rounds
back to back; the medians are reported. "mask ms/step" is the time spent computing and applying the
token bitmask, per engine step (advancing the matchers costs microseconds).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from backend.server.tools_demo import SAMPLE_SCHEMAS

SCHEMA = {
    "type": "object",
    "properties": {"people": {"type": "array", "items": SAMPLE_SCHEMAS["person"], "minItems": 1000}},
    "required": ["people"],
}


@dataclass(slots=True)
class Run:
    seconds: float
    tokens: int
    steps: int
    mask_seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder, GGUF file or Hub id (default model)")
    parser.add_argument("--batch-sizes", default="1,16", help="comma list (default: 1,16)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="runs per mode and batch size (median)")
    parser.add_argument("--no-interleave", action="store_true", help="run each mode's rounds back to back")


class MaskTimer:
    """Wraps the engine's bitmask step and output processing to add up the time masking costs."""

    def __init__(self, engine) -> None:
        self.seconds = 0.0
        manager = engine.structured_output
        apply = manager.apply_bitmask

        def timed_apply(logits, grammars):
            start = time.perf_counter()
            out = apply(logits, grammars)
            self.seconds += time.perf_counter() - start
            return out

        manager.apply_bitmask = timed_apply


def run_once(llm, timer: MaskTimer, prompts: list[list[int]], max_tokens: int, constrained: bool) -> Run:
    from backend.engine import SamplingParams, StructuredOutputsParams

    structured = StructuredOutputsParams(json=SCHEMA) if constrained else None
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, structured_outputs=structured
    )
    engine = llm.llm_engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bench-{time.monotonic_ns()}-{i}", prompt, params)
    timer.seconds, steps, tokens = 0.0, 0, 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens += len(out.outputs[0].token_ids)
        steps += 1
    return Run(time.perf_counter() - start, tokens, steps, timer.seconds)


def compare(llm, timer: MaskTimer, batch_size: int, args: argparse.Namespace) -> tuple[Run, Run]:
    prompts = [
        llm.chat_prompt(
            [{"role": "user", "content": f"List fictional people as JSON, starting with number {i}."}]
        )
        for i in range(batch_size)
    ]
    run_once(llm, timer, prompts, 4, True)  # warm-up: compile the grammar, build llguidance's tokenizer
    order = (
        [False, True] * args.rounds
        if not args.no_interleave
        else [False] * args.rounds + [True] * args.rounds
    )
    runs: dict[bool, list[Run]] = {False: [], True: []}
    for constrained in order:
        runs[constrained].append(run_once(llm, timer, prompts, args.max_tokens, constrained))
    pick = {c: sorted(r, key=lambda run: run.tokens_per_s)[len(r) // 2] for c, r in runs.items()}
    assert pick[False].tokens == pick[True].tokens == batch_size * args.max_tokens
    return pick[False], pick[True]


def main(args: argparse.Namespace) -> int:
    from backend.default_model import default_model
    from backend.engine import LLM

    llm = LLM(args.model or default_model(), max_num_seqs=64)
    timer = MaskTimer(llm.llm_engine)
    mode = "back to back" if args.no_interleave else "interleaved"
    print(f"model {llm.model_name}, {args.max_tokens} tokens per request, median of {args.rounds} ({mode})")
    header = f"{'batch':>5} | {'free tok/s':>10} | {'json tok/s':>10} | {'ratio':>6} | {'mask ms/step':>12}"
    print(header)
    print("-" * len(header))
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        free, constrained = compare(llm, timer, batch_size, args)
        ratio = constrained.tokens_per_s / free.tokens_per_s
        mask_ms = 1000 * constrained.mask_seconds / constrained.steps
        print(
            f"{batch_size:>5} | {free.tokens_per_s:>10.1f} | {constrained.tokens_per_s:>10.1f} | "
            f"{ratio:>6.1%} | {mask_ms:>12.2f}"
        )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
