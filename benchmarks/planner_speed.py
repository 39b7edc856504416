"""The planner's speed figures for the embedded engine against the engine itself, on this machine.

    python -m benchmarks.planner_speed                    # the default model: GGUF Q4_1 as stored, and bf16
    python -m benchmarks.planner_speed --tokens 32 --repeats 3 --batch 16 --prompt-len 512

One process: the default model's engine as stored and the same checkpoint dequantized to bf16 at load
(`dequantize_weights`). For each it measures batch-1 decode tok/s, batch-N decode tok/s and the time to first
token of a fresh prompt of --prompt-len tokens on the idle engine (prefix caching off, so no run reuses
another's blocks), and asks the planner for the same request the way the Launch card does
(`launch_here.running_engine_plan`: the engine's config and stats, on this machine's CPU). Prints measured,
predicted and predicted / measured. Decode rates are (time for N tokens - time for 1) / (N - 1) with the
engines taking turns (bench/quantized.py), so each excludes the prompt's prefill.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

from backend.bench.machine import cpu_summary
from backend.bench.offline import load_average, timed
from backend.bench.quantized import decode_rates
from benchmarks.quantized_formats import batch_rates


@dataclass(slots=True)
class Row:
    metric: str
    engine: str
    measured: float
    predicted: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured


def batch_decode_rates(engines: dict, prompts: list[list[int]], tokens: int, repeats: int) -> dict:
    """Decode tokens/s of each engine with len(prompts) sequences: the batch's time for `tokens` tokens
    less its time for 1 (bench/quantized_formats.batch_rates, which times whole batches)."""
    many = batch_rates(engines, prompts, tokens, repeats)
    one = batch_rates(engines, prompts, 1, repeats)
    seconds = {name: len(prompts) * tokens / rate - len(prompts) / one[name] for name, rate in many.items()}
    return {name: len(prompts) * (tokens - 1) / s for name, s in seconds.items()}


def ttft_seconds(llm, prompt: list[int], repeats: int) -> float:
    """Median time to the first token of `prompt` on the idle engine (max_tokens=1; no prefix caching)."""
    from backend.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1)
    return statistics.median(timed(lambda: llm.generate(prompt, params)) for _ in range(repeats))


def engines_for(model: str, batch: int, with_eager: bool) -> dict:
    """The checkpoint as stored and dequantized to bf16 (and both with enforce_eager when asked)."""
    from backend.engine import LLM

    def engine(dequantize: bool, eager: bool):
        dtype = "bfloat16" if dequantize else "auto"
        return LLM(model, dtype=dtype, device="cpu", max_num_seqs=batch, enable_prefix_caching=False,
                   dequantize_weights=dequantize, enforce_eager=eager)  # fmt: skip

    engines = {"as stored": engine(False, False)}
    print(f"as stored: {engines['as stored'].stats().quantization}", flush=True)
    engines["dequantized to bf16"] = engine(True, False)
    if with_eager:
        engines["as stored, eager"] = engine(False, True)
        engines["bf16, eager"] = engine(True, True)
    return engines


def predicted(llm, **workload):
    """The planner's estimate for the running engine, as the Launch card asks for it."""
    from backend.planner.advise import estimate
    from backend.planner.launch_here import running_engine_plan

    return estimate(running_engine_plan(llm.llm_engine.config, llm.stats(), **workload))


def engine_rows(name: str, llm, measured: dict[str, float], prompt_len: int, args) -> list[Row]:
    """The four rows of one engine: measured (batch-1, batch-N, TTFT) beside the planner's figures."""
    one = predicted(llm, input_len=prompt_len, output_len=args.tokens, concurrency=1)
    many = predicted(llm, input_len=prompt_len + 1, output_len=args.tokens, concurrency=args.batch)
    prefill = predicted(llm, input_len=args.prompt_len, output_len=1, concurrency=1)
    ttft, tokens = measured["ttft"], args.prompt_len
    return [
        Row("batch-1 decode tok/s", name, measured["batch 1"], one.decode_tokens_per_s_per_seq),
        Row(f"batch-{args.batch} decode tok/s", name, measured["batch"], many.decode_tokens_per_s_total),
        Row(f"TTFT {tokens} tokens, s", name, ttft, prefill.ttft_s),
        Row(f"prefill {tokens} tok/s", name, tokens / ttft, prefill.prefill_tokens_per_s),
    ]


def measure(engines: dict, args: argparse.Namespace) -> list[Row]:
    prompt = next(iter(engines.values())).tokenizer.encode("The capital of France is")
    batch = [[*prompt, i + 10] for i in range(args.batch)]
    single = decode_rates(engines, prompt, args.tokens, args.repeats)
    print(f"batch 1 done, load average {load_average()}", flush=True)
    batched = batch_decode_rates(engines, batch, args.tokens, args.repeats)
    print(f"batch {args.batch} done, load average {load_average()}", flush=True)
    long_prompt = (prompt * (args.prompt_len // len(prompt) + 1))[: args.prompt_len]
    rows = []
    for name, llm in engines.items():
        ttft = ttft_seconds(llm, long_prompt, args.repeats)
        measured = {"batch 1": single[name], "batch": batched[name], "ttft": ttft}
        rows += engine_rows(name, llm, measured, len(prompt), args)
    return rows


def print_rows(rows: list[Row]) -> None:
    print(f"\n{'metric':<26}{'engine':<24}{'measured':>11}{'predicted':>11}{'pred / meas':>13}")
    for row in rows:
        print(
            f"{row.metric:<26}{row.engine:<24}{row.measured:>11.3f}{row.predicted:>11.3f}{row.ratio:>12.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    import torch

    from backend.default_model import default_model
    from backend.planner.cpu_host import local_cpu_host

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default=None, help="GGUF file or model folder (default: the default one)")
    parser.add_argument("--tokens", type=int, default=32, help="generated tokens per decode run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per engine and test (medians)")
    parser.add_argument("--batch", type=int, default=16, help="sequences of the batched decode test")
    parser.add_argument("--prompt-len", type=int, default=512, help="tokens of the TTFT prompt")
    parser.add_argument("--with-eager", action="store_true", help="also both engines with enforce_eager")
    args = parser.parse_args(argv)
    model = args.model or default_model()
    print(f"model {model}, torch threads {torch.get_num_threads()}, load average {load_average()}")
    print(cpu_summary())
    print(f"planner's host: {local_cpu_host()}", flush=True)
    start = time.perf_counter()
    engines = engines_for(str(model), args.batch, args.with_eager)
    rows = measure(engines, args)
    print_rows(rows)
    print(f"\n{time.perf_counter() - start:.0f} s, load average {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
