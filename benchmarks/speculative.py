"""Speculative decoding: the embedded engine with and without n-gram drafts, same model, one process.

    python -m benchmarks.speculative                      # default model, copy workload + random batch
    python -m benchmarks.speculative --sweep 1,2,4,8      # where speculation stops paying (threshold)

(a) input-copying prompts built from bundled text ("correct the typos in this paragraph", "repeat this
code with one change"), greedy, at batch 1 and at a small batch: output tok/s without and with n-gram
speculation, acceptance rate and mean accepted length; (b) the offline benchmark's random workload at
64 concurrent sequences, speculation on with its default disable_by_batch_size in force: throughput
within a few percent of without. The CPU may be shared, so single timings are noisy: each round runs
every batch on both engines back to back (which goes first alternates from batch to batch), prints its
tok/s, ratio, acceptance rate, mean accepted length and the load average, and the last line of each
measurement holds the medians over rounds (the ratio is the median of the rounds' paired ratios).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from backend.bench import offline
from backend.bench.datasets import corpus_text

CODE_FILES = ("backend/engine/block_manager.py", "backend/engine/scheduler.py")
ROOT = Path(__file__).resolve().parents[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder, GGUF file or Hub id (default model)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per measurement")
    parser.add_argument("--max-tokens", type=int, default=160, help="per copy prompt")
    parser.add_argument("--batch-size", type=int, default=4, help="the small batch of copy prompts")
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=6,
        help="k (6: best of 3, 4, 6 on the copy workload, README)",
    )
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--sweep", default="", help="batch sizes to time with speculation never disabled")
    parser.add_argument("--random-prompts", type=int, default=64, help="(b): 0 skips it")
    parser.add_argument("--random-max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)


def typo(word: str, rng: random.Random) -> str:
    if len(word) < 4 or not word.isalpha():
        return word
    i = rng.randrange(len(word) - 1)
    return word[:i] + word[i + 1] + word[i] + word[i + 2 :]


def copy_prompts(count: int, rng: random.Random) -> list[str]:
    """Half "fix the typos in this passage" (bundled text, one word in five garbled), half "repeat this
    code with one change" (functions of this project, dedented). The text goes in a fenced block: so
    quoted, the default model writes it out again (unfenced, it often comments on it instead), which
    is what an input-copying workload is."""
    lines = [line for line in corpus_text().splitlines() if line.strip()]
    code = [textwrap.dedent(m.group(0)) for f in CODE_FILES for m in re.finditer(
            r"    def .+?(?=\n    def |\Z)", (ROOT / f).read_text(), re.S)]  # fmt: skip
    prompts = []
    for i in range(count):
        if i % 2 == 0:
            start = rng.randrange(len(lines) - 12)
            passage = "\n".join(lines[start : start + 12])
            garbled = " ".join(typo(w, rng) if rng.random() < 0.2 else w for w in passage.split(" "))
            prompts.append(
                f"Correct the typos in this passage and write it out in full:\n\n```\n{garbled}\n```"
            )
        else:
            snippet = rng.choice([c for c in code if 400 < len(c) < 1600])
            prompts.append(
                f"Repeat this Python code exactly, but rename `seq` to `sequence`:\n\n```python\n{snippet}```"
            )
    return prompts


def run(llm, prompts: list[list[int]], max_tokens: int) -> tuple[int, float]:
    """(output tokens, seconds) for the prompts at once, greedy."""
    from backend.engine import SamplingParams

    start = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    return sum(len(o.outputs[0].token_ids) for o in outs), time.perf_counter() - start


def spec_counts(llm) -> tuple[int, int, int]:
    stats = llm.stats()
    drafts = stats.spec_decode_num_drafts_total
    return drafts, stats.spec_decode_num_draft_tokens_total, stats.spec_decode_num_accepted_tokens_total


@dataclass
class Round:
    """One round's totals per engine, and what speculation did in it."""

    tokens: dict[str, int] = field(default_factory=lambda: {"plain": 0, "ngram": 0})
    seconds: dict[str, float] = field(default_factory=lambda: {"plain": 0.0, "ngram": 0.0})
    drafts: tuple[int, int, int] = (0, 0, 0)  # verifications, draft tokens, accepted tokens

    def rate(self, name: str) -> float:
        return self.tokens[name] / self.seconds[name]

    @property
    def ratio(self) -> float:
        return self.rate("ngram") / self.rate("plain")

    @property
    def acceptance_rate(self) -> float:
        return self.drafts[2] / self.drafts[1] if self.drafts[1] else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return 1 + self.drafts[2] / self.drafts[0] if self.drafts[0] else 0.0


def paired_round(engines: dict, pieces: list, measure, first: int) -> Round:
    """Every piece of work on both engines back to back, which one goes first alternating from piece to
    piece, so a change of the machine's load falls on both alike."""
    result, before = Round(), spec_counts(engines["ngram"])
    for i, piece in enumerate(pieces):
        names = ["plain", "ngram"] if (first + i) % 2 == 0 else ["ngram", "plain"]
        for name in names:
            tokens, seconds = measure(engines[name], piece)
            result.tokens[name] += tokens
            result.seconds[name] += seconds
    after = spec_counts(engines["ngram"])
    result.drafts = (after[0] - before[0], after[1] - before[1], after[2] - before[2])
    return result


def print_row(
    label: str, plain: float, ngram: float, ratio: float, accepted: float, length: float, load=""
) -> None:
    print(f"  {label:<24} {plain:>9.1f} {ngram:>9.1f} {ratio:>7.2f}x {accepted:>9.0%} {length:>9.2f}  {load}",
          flush=True)  # fmt: skip


def compare(engines: dict, label: str, pieces: list, measure, rounds: int) -> dict[str, float]:
    """Rounds of paired runs; one line per round (with the load average), then the medians."""
    results = []
    for r in range(rounds):
        one = paired_round(engines, pieces, measure, first=r)
        results.append(one)
        load = f"load {offline.load_average()}"
        print_row(f"{label}, round {r + 1}", one.rate("plain"), one.rate("ngram"), one.ratio,
                  one.acceptance_rate, one.mean_accepted_length, load)  # fmt: skip
    row = {
        "plain_tok_s": statistics.median(r.rate("plain") for r in results),
        "ngram_tok_s": statistics.median(r.rate("ngram") for r in results),
        "ratio": statistics.median(r.ratio for r in results),  # of the paired rounds' ratios
        "acceptance_rate": statistics.median(r.acceptance_rate for r in results),
        "mean_accepted_length": statistics.median(r.mean_accepted_length for r in results),
    }
    print_row(f"{label}, median", *row.values())
    return row


def main(args: argparse.Namespace) -> int:
    from backend.default_model import default_model
    from backend.engine import LLM

    model = args.model or default_model(check_hub=False)
    spec = {
        "method": "ngram",
        "num_speculative_tokens": args.num_speculative_tokens,
        "prompt_lookup_min": args.prompt_lookup_min,
        "prompt_lookup_max": args.prompt_lookup_max,
    }
    sweep = [int(b) for b in args.sweep.split(",") if b]
    never_off = {"disable_by_batch_size": 1024} if sweep else {}
    engines = {"plain": LLM(model, dtype=args.dtype), "ngram": LLM(model, dtype=args.dtype,
               speculative_config=spec | never_off)}  # fmt: skip
    print(f"model {model}, speculative_config {json.dumps(spec | never_off)}, load average "
          f"{offline.load_average()}", flush=True)  # fmt: skip
    rng = random.Random(args.seed)
    chat = engines["plain"].chat_prompt
    prompts = [chat([{"role": "user", "content": p}]) for p in copy_prompts(max(args.batch_size, 4), rng)]
    run(engines["plain"], prompts[:1], 4)  # warm-up both
    run(engines["ngram"], prompts[:1], 4)
    lengths = f"{min(map(len, prompts))}-{max(map(len, prompts))}"
    print(f"\n(a) copy workload, {len(prompts)} prompts of {lengths} tokens, max_tokens {args.max_tokens}; "
          f"{args.rounds} rounds, each batch run on both engines in turn")  # fmt: skip
    header()
    for batch in sweep or [1, args.batch_size]:
        work = (prompts * batch)[: max(batch, len(prompts))]
        pieces = [work[i : i + batch] for i in range(0, len(work), batch)]
        compare(engines, f"batch {batch}", pieces, lambda llm, p: run(llm, p, args.max_tokens), args.rounds)
    if args.random_prompts and not sweep:
        random_workload(engines, args)
    print(f"\nload average {offline.load_average()}")
    return 0


def random_workload(engines: dict, args: argparse.Namespace) -> None:
    """(b): the offline benchmark's random prompts, all at once (64 running: no drafts until the tail)."""
    work_args = argparse.Namespace(
        seed=args.seed,
        num_prompts=args.random_prompts,
        min_prompt_len=20,
        max_prompt_len=600,
        min_tokens=16,
        max_tokens=args.random_max_tokens,
    )
    work = offline.make_workload(engines["plain"].tokenizer, work_args)
    print(f"\n(b) random workload: {len(work.prompts)} prompts at once, {work.output_tokens} output tokens, "
          f"ignore_eos; {args.rounds} rounds, the engines in turn")  # fmt: skip
    header()
    compare(engines, f"{len(work.prompts)} concurrent", [work], lambda llm, w: (w.output_tokens,
            offline.run_engine(llm, w)), args.rounds)  # fmt: skip


def header() -> None:
    print(f"  {'':<24} {'plain':>9} {'ngram':>9} {'ratio':>8} {'accepted':>9} {'mean len':>9}")
    print(f"  {'':<24} {'tok/s':>9} {'tok/s':>9}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
