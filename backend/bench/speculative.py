"""Speculative decoding: the embedded engine with and without n-gram drafts, same model, one process.

    python -m backend.bench.speculative                   # default model, copy workload + random batch
    python -m backend.bench.speculative --sweep 1,2,4,8   # where speculation stops paying (threshold)

(a) input-copying prompts built from bundled text ("correct the typos in this paragraph", "repeat this
code with one change"), greedy, at batch 1 and at a small batch: output tok/s without and with n-gram
speculation, acceptance rate and mean accepted length; (b) the offline benchmark's random workload at
64 concurrent sequences, speculation on with its default disable_by_batch_size in force: throughput
within a few percent of without. The two engines run in interleaved rounds (plain, speculative, then
the other order) and the table shows medians: the CPU is shared, single timings are noisy.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
from pathlib import Path

from backend.bench import offline
from backend.bench.datasets import corpus_text

CODE_FILES = ("backend/engine/block_manager.py", "backend/engine/scheduler.py")
ROOT = Path(__file__).resolve().parents[2]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder, GGUF file or Hub id (default model)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per measurement")
    parser.add_argument("--max-tokens", type=int, default=160, help="per copy prompt")
    parser.add_argument("--batch-size", type=int, default=4, help="the small batch of copy prompts")
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
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
    """Half "fix the typos in this passage" (bundled text, one word in five garbled), half "repeat
    this code with one change" (functions of this project)."""
    lines = [line for line in corpus_text().splitlines() if line.strip()]
    code = [m.group(0) for f in CODE_FILES for m in re.finditer(r"    def .+?(?=\n    def |\Z)",
            (ROOT / f).read_text(), re.S)]  # fmt: skip
    prompts = []
    for i in range(count):
        if i % 2 == 0:
            start = rng.randrange(len(lines) - 12)
            passage = "\n".join(lines[start : start + 12])
            garbled = " ".join(typo(w, rng) if rng.random() < 0.2 else w for w in passage.split(" "))
            prompts.append(f"Correct the typos in this passage and write it out in full:\n\n{garbled}")
        else:
            snippet = rng.choice([c for c in code if 400 < len(c) < 1600])
            prompts.append(f"Repeat this Python code exactly, but rename `seq` to `sequence`:\n\n{snippet}")
    return prompts


def run(llm, prompts: list[list[int]], max_tokens: int, batch_size: int) -> tuple[int, float]:
    """(output tokens, seconds) for the prompts in batches of batch_size, greedy."""
    from backend.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    tokens, start = 0, time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        outs = llm.generate(prompts[i : i + batch_size], params)
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens, time.perf_counter() - start


def spec_counts(llm) -> tuple[int, int, int]:
    stats = llm.stats()
    drafts = stats.spec_decode_num_drafts_total
    return drafts, stats.spec_decode_num_draft_tokens_total, stats.spec_decode_num_accepted_tokens_total


def interleaved(engines: dict, measure, rounds: int) -> dict[str, float]:
    """Median tok/s per engine over rounds, alternating which engine goes first."""
    rates: dict[str, list[float]] = {name: [] for name in engines}
    names = list(engines)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            tokens, seconds = measure(engines[name])
            rates[name].append(tokens / seconds)
    return {name: statistics.median(values) for name, values in rates.items()}


def compare(engines: dict, label: str, measure, rounds: int) -> dict[str, float]:
    before = spec_counts(engines["ngram"])
    medians = interleaved(engines, measure, rounds)
    drafts, draft_tokens, accepted = (
        a - b for a, b in zip(spec_counts(engines["ngram"]), before, strict=True)
    )
    row = {
        "plain_tok_s": medians["plain"],
        "ngram_tok_s": medians["ngram"],
        "ratio": medians["ngram"] / medians["plain"],
        "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "mean_accepted_length": 1 + accepted / drafts if drafts else 0.0,
    }
    print(
        f"  {label:<34} {row['plain_tok_s']:>9.1f} {row['ngram_tok_s']:>9.1f} {row['ratio']:>7.2f}x "
        f"{row['acceptance_rate']:>10.0%} {row['mean_accepted_length']:>9.2f}",
        flush=True,
    )
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
    run(engines["plain"], prompts[:1], 4, 1)  # warm-up both
    run(engines["ngram"], prompts[:1], 4, 1)
    print(f"\n(a) copy workload, {len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} "
          f"tokens, max_tokens {args.max_tokens}; medians of {args.rounds} interleaved rounds")  # fmt: skip
    print(f"  {'':<34} {'plain':>9} {'ngram':>9} {'ratio':>8} {'accepted':>10} {'mean len':>9}")
    print(f"  {'':<34} {'tok/s':>9} {'tok/s':>9}")
    for batch in sweep or [1, args.batch_size]:
        work = (prompts * batch)[: max(batch, len(prompts))]
        compare(engines, f"batch {batch}", lambda llm, w=work, b=batch: run(llm, w, args.max_tokens, b),
                args.rounds)  # fmt: skip
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
          f"ignore_eos; medians of {args.rounds} interleaved rounds")  # fmt: skip
    compare(engines, f"{len(work.prompts)} concurrent", lambda llm: (work.output_tokens,
            offline.run_engine(llm, work)), args.rounds)  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
