"""Compare engines on one workload: each target in turn (embedded, vllm, sglang, llamacpp or an OpenAI URL).

Local engines are launched one at a time with the exported command for the same plan (the model as a dense
safetensors folder, which every engine loads), benchmarked at each concurrency, then stopped before the
next one starts.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

LOCAL = ("embedded", "vllm", "sglang", "llamacpp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        action="append",
        required=True,
        help=f"{', '.join(LOCAL)} (launched here) or an OpenAI API URL; give two or more",
    )
    parser.add_argument("--model", default=None, help="model folder or .gguf (default: the packaged model)")
    parser.add_argument("--dataset", default="chat", help="random, chat, prefix-repetition or FILE.jsonl")
    parser.add_argument("--num-prompts", type=int, default=50)
    parser.add_argument(
        "--max-concurrency", type=int, nargs="+", default=[16], help="one or more (one row per target each)"
    )
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ignore-eos", action="store_true", help="every request runs to --output-len")
    parser.add_argument(
        "--warmup", type=int, default=0, help="untimed requests to each target first (prompts of their own)"
    )
    parser.add_argument("--start-timeout", type=float, default=1800.0, help="seconds for an engine to start")
    parser.add_argument(
        "--vllm-eager",
        action="store_true",
        help="vLLM with --enforce-eager (default: compiled, as `vllm serve` runs; the Launch tab runs eager)",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="one step token budget for every local engine (default: each its own: vLLM CPU serve 2048, "
        "embedded 512)",
    )
    parser.add_argument(
        "--skip-offline",
        action="store_true",
        help="leave out the offline column (embedded: LLM.generate on each run's prompts, after its server)",
    )
    parser.add_argument(
        "--quality-chunks",
        type=int,
        default=4,
        help="chunks of 256 tokens of the quality text each target is scored on (PPL, KL, top-1 against "
        "the reference; 0 = no quality columns)",
    )
    parser.add_argument(
        "--quality-reference",
        default=None,
        help="the quality reference, run here before the targets, as `app.py quality` specs: "
        "MODEL[@OPTION,...] (default: the compared model @dtype=float32)",
    )
    parser.add_argument("--out", default="compare-out", help="folder for compare.json and compare.html")


def main(args: argparse.Namespace) -> int:
    from backend.bench.compare import Comparison, Workload, split_runs
    from backend.bench.compare_report import bar_lines, format_table, note_lines, write_report
    from backend.bench.compare_targets import model_folder

    if len(args.target) < 2:
        raise SystemExit("compare: give at least two --target values")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the engines it started on the way out
    try:
        model = model_folder(args.model, Path(args.out))
        workload = Workload(
            dataset=args.dataset,
            num_prompts=args.num_prompts,
            max_concurrency=args.max_concurrency[0],
            input_len=args.input_len,
            output_len=args.output_len,
            seed=args.seed,
            ignore_eos=args.ignore_eos,
            tokenizer=model,  # `random` as vLLM's: token ids of the model's tokenizer
        )
        warmup, runs = split_runs(workload, args.max_concurrency, args.warmup)
    except ValueError as exc:
        raise SystemExit(f"compare: {exc}") from None
    if args.quality_chunks < 0:
        raise SystemExit(f"compare: --quality-chunks must be >= 0, got {args.quality_chunks}")
    comparison = Comparison(workload, [])
    with quality_reference(args, model) as quality:
        comparison.quality_reference = quality.reference if quality else None
        run_targets(args, model, warmup, runs, comparison, quality)
    print(format_table(comparison.rows()))
    print("\n".join(bar_lines(comparison) + note_lines(comparison)))
    paths = write_report(comparison, args.out)
    print(f"Wrote {paths['json']} and {paths['html']}")
    return 0 if all(r.failed == 0 for r in comparison.rows()) else 1


@contextmanager
def quality_reference(args: argparse.Namespace, model: str) -> Iterator[Any]:
    """The quality reference scored here before any target starts (None: --quality-chunks 0)."""
    if not args.quality_chunks:
        yield None
        return
    from backend.bench.compare_quality import default_reference_spec, engine_reference
    from backend.errors import UserError

    spec = args.quality_reference or default_reference_spec(model)
    print(f"* quality reference {spec}: {args.quality_chunks} chunks", flush=True)
    try:
        quality = engine_reference(spec, args.quality_chunks)
    except UserError as exc:
        raise SystemExit(f"compare: quality reference: {exc}") from None
    with quality:
        yield quality


def run_targets(args: argparse.Namespace, model: str, warmup, runs, comparison, quality=None) -> None:
    """Each target in turn: start, warm up, one run per concurrency, quality, stop; then the offline
    column."""
    from backend.bench.compare import prompt_salts, run_target
    from backend.bench.compare_offline import run_offline
    from backend.bench.compare_report import format_table
    from backend.bench.compare_targets import LocalTargets, url_target

    max_num_seqs = max(args.max_concurrency)
    local = LocalTargets(
        model, args.max_model_len, max_num_seqs, args.vllm_eager, args.max_num_batched_tokens
    )
    salts = prompt_salts(len(args.target), runs[0].tokenizer)  # a server given twice: no shared cache
    with local:
        for name, salt in zip(args.target, salts, strict=True):
            target = local.start(name, args.start_timeout) if name in LOCAL else url_target(name)
            warm = replace(warmup, salt=salt) if warmup is not None else None
            salted = [replace(run, salt=salt) for run in runs]  # the offline column runs them too
            if warm is not None:
                print(f"* {name}: {warm.num_prompts} warm-up requests (untimed)", flush=True)
                run_target(target, warm)
            for run in salted:
                label = name if len(runs) == 1 else f"{name} c={run.max_concurrency}"
                print(f"* {label}: {run.num_prompts} requests", flush=True)
                comparison.runs.append(run_target(replace(target, name=label), run))
                print(format_table([comparison.runs[-1].row]), flush=True)
            if quality is not None:
                score_quality(quality, target, comparison)
            local.stop(name)  # the next engine gets the whole machine
            if name == "embedded" and not args.skip_offline:
                for run in salted:
                    print(f"* offline engine c={run.max_concurrency}: {run.num_prompts} requests", flush=True)
                    offline = run_offline(local.engine_config(run.max_concurrency), run, warm)
                    comparison.offline.append(offline)
                    print(f"  {offline.output_tok_s or 0:,.1f} tok/s ({offline.detail})", flush=True)


def score_quality(quality, target, comparison) -> None:
    """The target's quality figures on its rows, printed as one line."""
    from backend.bench.compare_quality import attach

    print(f"* {target.name}: quality on {len(quality.chunks.chunks)} chunks", flush=True)
    scored = quality.score_target(target)
    attach(comparison.rows(), target.name, scored)
    r = scored.result
    if r is None:
        print(f"  no quality figures: {scored.note}", flush=True)
    else:
        kld = "n/a" if r.kld_mean is None else f"{r.kld_mean:.4f} ({r.kld_kind})"
        print(f"  PPL {r.ppl:.3f}, KLD mean {kld}, same top-1 {100 * r.same_top_p:.1f} %", flush=True)
