"""llama.cpp's decode speed as its own benchmarks measure it: llama-bench for one sequence (`-p 0 -n N`:
N single-token decode calls from an empty context, the tg test) and llama-batched-bench for B sequences
(`-npp P -ntg N -npl B`: B prompts of P random tokens prefilled, then N decode calls of B tokens each, only
these timed: its S_TG column). Both read their JSON output (llama-bench -o json, llama-batched-bench
--output-format jsonl), which carries the same figures as their markdown tables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from backend.bench.llamacpp_tools import run_tool


@dataclass(slots=True)
class PeerDecode:
    """One llama.cpp measurement: decode tokens/s over all sequences, and what produced it."""

    batch_size: int  # sequences decoding together
    tokens_per_s: float
    command: str  # the tool and its arguments, as run


def parse_llama_bench(text: str, n_gen: int) -> float:
    """The tg test's mean tokens/s (avg_ts) from llama-bench -o json output; the run must be -p 0 -n n_gen."""
    try:
        tests = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"llama-bench output is not its -o json output: {exc}: {text[:200]!r}") from exc
    found = [t for t in tests if t.get("n_prompt") == 0 and t.get("n_gen") == n_gen]
    if len(found) != 1:
        tried = [(t.get("n_prompt"), t.get("n_gen")) for t in tests]
        raise ValueError(f"llama-bench output has no single tg{n_gen} test (n_prompt, n_gen): {tried}")
    return float(found[0]["avg_ts"])


def parse_batched_bench(text: str, batch_size: int, n_gen: int) -> float:
    """Decode tokens/s over all sequences (speed_tg = pl * tg / t_tg) of the row with pl = batch_size and
    tg = n_gen, from llama-batched-bench --output-format jsonl output (one JSON object a line)."""
    rows = [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]
    found = [r for r in rows if r["pl"] == batch_size and r["tg"] == n_gen]
    if not found:
        tried = [(r["pl"], r["tg"]) for r in rows]
        raise ValueError(f"llama-batched-bench output has no row pl={batch_size}, tg={n_gen}: {tried}")
    return float(found[-1]["speed_tg"])


def llama_bench_decode(model: Path, n_gen: int, threads: int) -> PeerDecode:
    """One sequence: llama-bench's tg test, one repetition after its own untimed warm-up run."""
    args = ["-m", str(model), "-p", "0", "-n", str(n_gen), "-t", str(threads), "-r", "1", "-o", "json"]
    text = run_tool("llama-bench", *args, timeout=3600)
    return PeerDecode(1, parse_llama_bench(text, n_gen), "llama-bench " + " ".join(args))


def batched_bench_decode(
    model: Path, batch_size: int, prompt_len: int, n_gen: int, threads: int
) -> PeerDecode:
    """batch_size sequences of prompt_len-token prompts decoding n_gen tokens together (after its own warm-up
    decode of 16 tokens); the context holds all of them (one KV cell a token)."""
    context = batch_size * (prompt_len + n_gen)
    args = ["-m", str(model), "-c", str(context), "-npp", str(prompt_len), "-ntg", str(n_gen)]
    args += ["-npl", str(batch_size), "-t", str(threads), "--output-format", "jsonl"]
    text = run_tool("llama-batched-bench", *args, timeout=3600)
    return PeerDecode(
        batch_size, parse_batched_bench(text, batch_size, n_gen), "llama-batched-bench " + " ".join(args)
    )
