"""Compare engines on one workload: each target in turn (embedded, vllm, sglang, llamacpp or an OpenAI URL).

Local engines are launched one at a time with the exported command for the same plan (the model as a dense
safetensors folder, which every engine loads), benchmarked at each concurrency, then stopped before the
next one starts.
"""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import replace
from pathlib import Path

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
    parser.add_argument("--warmup", type=int, default=0, help="untimed requests to each target first")
    parser.add_argument("--start-timeout", type=float, default=1800.0, help="seconds for an engine to start")
    parser.add_argument("--out", default="compare-out", help="folder for compare.json and compare.html")


def main(args: argparse.Namespace) -> int:
    from backend.bench.compare import Comparison, Workload, run_target
    from backend.bench.compare_report import format_table, write_report
    from backend.bench.compare_targets import LocalTargets, model_folder, url_target

    if len(args.target) < 2:
        raise SystemExit("compare: give at least two --target values")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the engines it started on the way out
    try:
        workload = Workload(
            dataset=args.dataset,
            num_prompts=args.num_prompts,
            max_concurrency=args.max_concurrency[0],
            input_len=args.input_len,
            output_len=args.output_len,
            seed=args.seed,
            ignore_eos=args.ignore_eos,
        )
        model = model_folder(args.model, Path(args.out))
    except ValueError as exc:
        raise SystemExit(f"compare: {exc}") from None
    runs = []
    with LocalTargets(model, args.max_model_len, max(args.max_concurrency)) as local:
        for name in args.target:
            target = local.start(name, args.start_timeout) if name in LOCAL else url_target(name)
            if args.warmup:
                run_target(target, replace(workload, num_prompts=args.warmup, seed=workload.seed + 99))
            for concurrency in args.max_concurrency:
                label = name if len(args.max_concurrency) == 1 else f"{name} c={concurrency}"
                print(f"* {label}: {workload.num_prompts} requests", flush=True)
                run = run_target(replace(target, name=label), replace(workload, max_concurrency=concurrency))
                runs.append(run)
                print(format_table([run.row]), flush=True)
            local.stop(name)  # the next engine gets the whole machine
    comparison = Comparison(workload, runs)
    print(format_table(comparison.rows()))
    paths = write_report(comparison, args.out)
    print(f"Wrote {paths['json']} and {paths['html']}")
    return 0 if all(r.failed == 0 for r in comparison.rows()) else 1
