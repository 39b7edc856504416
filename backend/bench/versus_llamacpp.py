"""Decode speed against llama.cpp on the very same GGUF file, in one run (issue 30):

    python -m backend.bench.versus_llamacpp                       # Llama-3.2-1B's shape, llama-quantize Q4_0
    python -m backend.bench.versus_llamacpp --shapes olmoe-1b-7b-4l   # OLMoE-1B-7B's shape, 4 of 16 layers
    python -m backend.bench.versus_llamacpp --rounds 3 --batch-sizes 1,16 --n-gen 64 --prompt-len 16
    python -m backend.bench.versus_llamacpp --model FILE.gguf     # any GGUF file both can run
    python -m backend.bench.offline --peer llamacpp [--model FILE.gguf]   # the same, with the defaults
    PLAYGROUND_CPU_ISA=avx2 python -m backend.bench.versus_llamacpp   # both as on a CPU with AVX2 only

The file is a random-weight model of the shape (bench_models.py: written by llama.cpp's own converter,
quantized by its llama-quantize), so both read the same bytes. Batch 1 is llama-bench's tg test
(`-p 0 -n N`) beside our engine decoding N tokens for one sequence; batch B is llama-batched-bench
(`-npp P -ntg N -npl B`, its S_TG) beside our engine decoding N tokens for B sequences of P-token prompts
together. Only decode steps are timed on either side (prompts are prefilled first, untimed). Our engine runs
as served: captured decode steps, the GGUF's blocks as stored, torch threads = llama.cpp's -t = the cores.

A first round of every measurement is untimed (weights paged in, kernels built, batch shapes captured);
then --rounds rounds alternate the two engines measurement by measurement, so that a busy neighbour on a
shared machine slows both alike. The table gives each row's median and spread, and the median of the
rounds' ratios (ours over llama.cpp's in the same round). --pure quantizes every matrix to Q4_0 (the
default is llama-quantize's Q4_0 mix, which keeps a tied embedding as Q6_K).

On a CPU with AVX-512, PLAYGROUND_CPU_ISA=avx2 measures the AVX2 paths of both: our kernels built for
-march=haswell with the AVX-512 flags hidden (fp32 compute, as on an AVX2 CPU), torch's on AVX2
(ATEN_CPU_CAPABILITY, set by rerunning the command), and llama.cpp's AVX2 build
(`PLAYGROUND_CPU_ISA=avx2 make llama-cpp`).
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import subprocess
import time
from pathlib import Path

from backend.bench import bench_models, random_model
from backend.bench.decode_table import ENGINE, PEER, DecodeRow, format_table
from backend.bench.llamacpp_decode import batched_bench_decode, llama_bench_decode
from backend.bench.llamacpp_tools import REPO
from backend.bench.machine import cpu_summary, rerun_with_torch_isa


def engine_decode(llm, batch_size: int, prompt_len: int, n_gen: int, seed: int) -> float:
    """Aggregate decode tokens/s of batch_size sequences (random prompt_len-token prompts, prefilled
    untimed) over n_gen decode steps, greedy."""
    from backend.engine import SamplingParams

    engine = llm.llm_engine
    rng = random.Random(seed)
    vocab = min(engine.runner.model.args.vocab_size, len(engine.tokenizer))
    params = SamplingParams(temperature=0.0, max_tokens=n_gen + 1, ignore_eos=True)  # +1: the prefill's
    for i in range(batch_size):
        engine.add_request(
            f"decode-{seed}-{i}", [rng.randrange(100, vocab) for _ in range(prompt_len)], params
        )
    while any(seq.num_output_tokens == 0 for r in engine.requests.values() for seq in r.seqs):
        engine.step()
    steps, start = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    elapsed = time.perf_counter() - start
    assert steps == n_gen, f"{steps} decode steps for {n_gen} tokens: the batch did not decode together"
    return batch_size * n_gen / elapsed


def load_engine(model: Path, args: argparse.Namespace):
    import torch

    from backend.engine import LLM

    torch.set_num_threads(args.threads)
    batch = max(args.batch_sizes)
    return LLM(
        str(model),
        max_num_seqs=batch,
        max_num_batched_tokens=max(512, batch * args.prompt_len),
        max_model_len=args.prompt_len + args.n_gen + 16,
        kv_cache_memory_bytes=256 << 20,  # 16 sequences of 96 tokens need ~50 MiB on Llama-3.2-1B
        enable_prefix_caching=False,
    )


def measure_round(llm, model: Path, args: argparse.Namespace, seed: int) -> dict[tuple[str, int], float]:
    """One measurement of each (engine, batch size), the two engines alternating."""
    out: dict[tuple[str, int], float] = {}
    for batch_size in args.batch_sizes:
        prompt_len = 1 if batch_size == 1 else args.prompt_len  # llama-bench's tg test starts at position 0
        out[ENGINE, batch_size] = engine_decode(llm, batch_size, prompt_len, args.n_gen, seed)
        print(f"  {ENGINE:<9} batch {batch_size:>2}: {out[ENGINE, batch_size]:8.2f} tok/s", flush=True)
        if batch_size == 1:
            peer = llama_bench_decode(model, args.n_gen, args.threads)
        else:
            peer = batched_bench_decode(model, batch_size, args.prompt_len, args.n_gen, args.threads)
        out[PEER, batch_size] = peer.tokens_per_s
        print(
            f"  {PEER:<9} batch {batch_size:>2}: {peer.tokens_per_s:8.2f} tok/s ({peer.command})", flush=True
        )
    return out


def commit() -> str:
    """This checkout's commit, marked -dirty when files differ from it."""

    def git(*words: str) -> str:
        return subprocess.run(["git", *words], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("-dirty" if git("status", "--porcelain", "-uno") else "")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(model: Path, args: argparse.Namespace) -> list[DecodeRow]:
    print(f"\n{model.name}: {bench_models.tensor_types(model)}", flush=True)
    llm = load_engine(model, args)
    rows = {(name, b): DecodeRow(name, b) for b in args.batch_sizes for name in (PEER, ENGINE)}
    for round_number in range(args.rounds + 1):
        label = "untimed warm-up" if round_number == 0 else f"{round_number} of {args.rounds}"
        print(f"round {label}, load average {load_average()}", flush=True)
        for key, value in measure_round(llm, model, args, seed=round_number).items():
            if round_number > 0:
                rows[key].samples.append(value)
    return list(rows.values())


def main(args: argparse.Namespace) -> int:
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{started}, commit {commit()}, {args.threads} threads each, load average {load_average()}")
    print(cpu_summary(), flush=True)
    if args.model:
        models = [Path(args.model)]
    else:
        models = [bench_models.bench_gguf(shape, "Q4_0", args.pure) for shape in args.shapes]
    for model in models:
        rows = run(model, args)
        workload = f"{args.rounds} rounds of {args.n_gen} tokens, {args.prompt_len}-token prompts (batch > 1)"
        print(
            f"\n{model.name}: decode tokens/s over all sequences, {workload}, load average {load_average()}"
        )
        print("\n".join(format_table(rows)), flush=True)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from backend.planner.cpu_host import local_cpu_host

    parser.add_argument("--model", default=None, help="a GGUF file (default: --shapes' random models)")
    shapes = ", ".join(random_model.SHAPES)
    parser.add_argument(
        "--shapes",
        type=lambda s: s.split(","),
        default=["llama-3.2-1b"],
        help=f"random models in Q4_0: {shapes}",
    )
    parser.add_argument(
        "--pure", action="store_true", help="every matrix Q4_0 (default: llama-quantize's mix)"
    )
    parser.add_argument("--batch-sizes", type=lambda s: [int(b) for b in s.split(",")], default=[1, 16])
    parser.add_argument("--n-gen", type=int, default=64, help="decode steps timed")
    parser.add_argument(
        "--prompt-len", type=int, default=16, help="prompt tokens of each sequence (batch > 1)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, after one untimed")
    parser.add_argument("--threads", type=int, default=local_cpu_host().cores, help="default: the cores")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    rerun_with_torch_isa()
    raise SystemExit(main(parse_args()))
