"""Measure what a quantization costs in quality: perplexity, KL divergence and top-1 agreement of each
model against a reference, on a text shipped with the project (llama.cpp's `llama-perplexity
--kl-divergence`, run through the engine's own prompt logprobs).

Examples:
  python app.py quality        # the default model: Q4_1 as stored and fp8 KV vs its dequantized weights
  python app.py quality --reference default@dequantized --model default --model default@kv=fp8
  python app.py quality --reference ./llama-dense --model ./llama-gptq --ctx 512 --out quality.json
  python app.py quality --reference default --model default --kv-cache-dtype fp8
"""

from __future__ import annotations

import argparse
import sys

from backend.quality.config import QualityConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    QualityConfig.add_cli_args(parser)


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from backend.quality.measure import run_quality
    from backend.quality.report import format_table, summary_line, write_json

    try:
        config = QualityConfig.from_cli_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bar = tqdm(total=0, unit="chunk", desc="quality")

    def progress(done: int, total: int, label: str) -> None:
        bar.total = total
        bar.set_description(label)
        bar.update(done - bar.n)

    try:
        report = run_quality(config, progress)
    except ValueError as exc:
        bar.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bar.close()
    print(summary_line(report))
    print(format_table(report))
    if config.out:
        print(f"Wrote {write_json(report, config.out)}")
    return 0
