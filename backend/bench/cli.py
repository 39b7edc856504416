"""Benchmark any OpenAI-compatible server (like `vllm bench serve`): TTFT, TPOT, ITL, E2E, throughput."""

from __future__ import annotations

import argparse
import math
import os


def rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"request rate must be a number > 0 or 'inf', got {text!r}"
        ) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"request rate must be > 0 or 'inf', got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the server's OpenAI API root")
    parser.add_argument("--model", required=True, help="model name as the server knows it (see /v1/models)")
    parser.add_argument("--dataset", default="random", help="random, chat, prefix-repetition or FILE.jsonl")
    parser.add_argument("--num-prompts", type=int, default=100, help="requests to send (default: 100)")
    parser.add_argument("--request-rate", type=rate, default=math.inf, help="requests/s or inf (default)")
    parser.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 = Poisson (default)")
    parser.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight")
    parser.add_argument("--input-len", type=int, default=256, help="prompt length (default: 256)")
    parser.add_argument("--output-len", type=int, default=128, help="max_tokens per request (default: 128)")
    parser.add_argument("--range-ratio", type=float, default=0.0, help="length spread, in [0, 1)")
    parser.add_argument("--num-prefixes", type=int, default=4, help="prefix-repetition: shared prefixes")
    parser.add_argument("--prefix-len", type=int, default=192, help="prefix-repetition: prefix length")
    parser.add_argument("--endpoint", default="auto", choices=["auto", "chat", "completions"])
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0)")
    parser.add_argument("--ignore-eos", action="store_true", help="always generate --output-len tokens")
    parser.add_argument("--tokenizer", default=None, help="count prompt lengths in this tokenizer's tokens")
    parser.add_argument(
        "--api-key-env", default=None, metavar="VAR", help="environment variable with the key"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--out", default=None, help="write the full result as JSON here")


def main(args: argparse.Namespace) -> int:
    import json

    from tqdm import tqdm

    from backend.bench.serve import BenchConfig, format_result, run_benchmark
    from backend.monitor.samples import MetricsPoller

    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    try:
        config = BenchConfig(
            base_url=args.base_url,
            model=args.model,
            dataset=args.dataset,
            num_prompts=args.num_prompts,
            request_rate=args.request_rate,
            burstiness=args.burstiness,
            max_concurrency=args.max_concurrency,
            input_len=args.input_len,
            output_len=args.output_len,
            range_ratio=args.range_ratio,
            num_prefixes=args.num_prefixes,
            prefix_len=args.prefix_len,
            seed=args.seed,
            endpoint=args.endpoint,
            temperature=args.temperature,
            ignore_eos=args.ignore_eos,
            api_key=api_key,
            tokenizer=args.tokenizer,
        )
    except ValueError as exc:
        raise SystemExit(f"bench: {exc}") from None
    with tqdm(total=config.num_prompts, desc="requests", unit="req") as bar:
        try:
            result = run_benchmark(config, progress=lambda done, total: bar.update(done - bar.n))
        except (ValueError, OSError) as exc:  # a bad dataset file, say
            raise SystemExit(f"bench: {exc}") from None
    print(format_result(result))
    after = MetricsPoller(config.base_url, api_key).poll()
    if after.get("error") is None:
        used, total = after["num_kv_blocks_used"], after["num_kv_blocks_total"]
        print(
            f"Server after the run ({after['engine']}): {after['num_requests_running']} running, "
            f"{after['num_requests_waiting']} waiting, KV blocks used {used} of {total}"
        )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result.to_dict(), f, indent=1)
        print(f"Wrote {args.out}")
    return 0 if result.failed == 0 else 1
