"""Estimate memory, speed and cost of serving a model on GPUs (the planner, without the UI).

Examples:
  python app.py estimate --model meta-llama/Llama-3.1-8B-Instruct --gpu H100-80GB
  python app.py estimate --model Qwen/Qwen2.5-72B-Instruct --gpu A100-80GB --num-gpus 4 \
      --quant awq-int4 --json
  python app.py estimate --list-gpus
"""

from __future__ import annotations

import argparse
import json
import sys

from backend.engines import ENGINES
from backend.planner.request import USAGE_CONTEXTS

GIB = 1024**3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--model", help="Hub id, local folder, .gguf file, or a bundled preset (by Hub id)")
    parser.add_argument("--gpu", default="H100-80GB", help="GPU short name (see --list-gpus); CPU for no GPU")
    parser.add_argument("--num-gpus", type=int, default=1)
    parser.add_argument("--tp", type=int, default=None, help="tensor parallel size (default: num_gpus / pp)")
    parser.add_argument("--pp", type=int, default=1, help="pipeline parallel size")
    parser.add_argument(
        "--quant",
        default="auto",
        help="weight format (see --list-quants); default: as stored in the checkpoint",
    )
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    parser.add_argument("--max-num-seqs", type=int, default=None, help="default: the engine's own default")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="default: the engine's own default"
    )
    parser.add_argument("--engine", default="vllm", choices=ENGINES)
    parser.add_argument(
        "--vllm-version", default=None, help="vLLM whose accounting to follow (default: the export's target)"
    )
    parser.add_argument(
        "--usage-context", default="openai_api_server", choices=USAGE_CONTEXTS, help="vllm serve or LLM(...)"
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="no CUDA graphs (vLLM's flag; the embedded engine: no captured decode step), so none counted",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--list-gpus", action="store_true", help="list the GPU catalog and exit")
    parser.add_argument("--list-presets", action="store_true", help="list bundled model presets and exit")
    parser.add_argument(
        "--list-quants", action="store_true", help="list weight and KV cache formats and exit"
    )


def _listing(args: argparse.Namespace) -> str | None:
    from backend.planner import catalog

    if args.list_gpus:
        rows = [catalog.get_gpu(name) for name in catalog.list_gpus()]
        lines = [f"{'name':<14}{'memory':>9}{'TB/s':>7}{'bf16 TF':>9}{'$/h':>7}  label"]
        lines += [
            f"{g.name:<14}{g.memory_gb:>6} GB{g.bandwidth_bytes_s / 1e12:>7.2f}{g.flops_bf16 / 1e12:>9.0f}"
            f"{g.price_per_hour:>7.2f}  {g.label}"
            for g in rows
        ]
        return "\n".join(lines)
    if args.list_presets:
        return "\n".join(catalog.list_presets())
    if args.list_quants:
        weights = [
            f"{q:<16}{catalog.get_quantization(q).bits:>8.3f} bits  {catalog.get_quantization(q).label}"
            for q in catalog.list_quantizations()
        ]
        kv = [
            f"{k:<16}{catalog.get_kv_cache_dtype(k).bytes:>8.4f} bytes {catalog.get_kv_cache_dtype(k).label}"
            for k in catalog.list_kv_cache_dtypes()
        ]
        return "weights:\n" + "\n".join(weights) + "\nKV cache:\n" + "\n".join(kv)
    return None


def concurrency_text(d: dict) -> str:
    """Concurrency as the plan runs; when it does not start, what it would be after the first fix."""
    seq = d["input_len"] + d["output_len"]
    if d["fits"]:
        return f"{d['max_concurrency']} x {seq} tokens"
    after = d.get("max_concurrency_after_fix")
    if after is None:
        return "does not start, and no fix found"
    return f"does not start; {after} x {seq} tokens after the first fix below"


def format_table(d: dict) -> str:
    def gib(key: str) -> str:
        return f"{d[key] / GIB:.2f} GiB"

    def num(value, fmt: str = ",.1f") -> str:
        return "-" if value is None else format(value, fmt)

    rows = [
        (
            "model",
            f"{d['model']} ({d['params_total'] / 1e9:.2f}B params, {d['params_active'] / 1e9:.2f}B active)",
        ),
        (
            "plan",
            f"{d['engine']} on {d['num_gpus']} x {d['gpu']} (TP={d['tp']}, PP={d['pp']}), "
            f"{d['quant']} weights, {d['kv_cache_dtype']} KV cache"
            + (f", vLLM {d['vllm_version']} accounting" if d.get("vllm_version") else ""),
        ),
        ("fits", f"{'yes' if d['fits'] else 'NO'}: {d['fit_reason']}"),
        ("weights / GPU", gib("weights_bytes")),
        (
            "KV cache / GPU",
            f"{gib('kv_cache_bytes')} = {d['kv_cache_tokens']:,} tokens "
            f"({d['kv_bytes_per_token'] / 1024:.1f} KiB per token)",
        ),
        ("activations", gib("activation_bytes")),
        ("runtime overhead", gib("overhead_bytes")),
        ("CUDA graphs", gib("cuda_graph_bytes")),
        ("total / GPU", f"{gib('total_bytes_per_gpu')} of {gib('gpu_memory_bytes')}"),
        ("max concurrency", concurrency_text(d)),
        ("longest sequence", f"{d['max_model_len_single']:,} tokens (max_model_len {d['max_model_len']:,})"),
        ("prefill", f"{num(d['prefill_tokens_per_s'], ',.0f')} tokens/s, TTFT {num(d['ttft_s'], '.3f')} s"),
        (
            "decode",
            f"{num(d['decode_tokens_per_s_per_seq'])} tokens/s per sequence, "
            f"{num(d['decode_tokens_per_s_total'], ',.0f')} tokens/s at batch {d['batch_size']}",
        ),
        (
            "cost",
            f"${num(d['cost_per_million_output_tokens'], '.3f')} per 1M output tokens, "
            f"${num(d['cost_per_million_input_tokens'], '.3f')} per 1M input (${d['price_per_hour']:.2f}/h)",
        ),
    ]
    lines = [f"{k:<18}{v}" for k, v in rows]
    if d.get("vllm_family"):
        lines.append(f"{'memory terms':<18}vLLM {d['vllm_family']} (- = subtracted from the budget)")
    lines += [
        f"  {'-' if t['subtracted'] else ' '} {t['name']:<22}{t['bytes'] / GIB:>8.2f} GiB  {t['how']}"
        for t in d.get("memory_terms", [])
    ]
    lines += [f"{'warning':<18}{w}" for w in d["warnings"]]
    lines += [f"{'fix':<18}{f}" for f in d["fixes"]]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from backend.planner import PlanRequest, estimate

    listing = _listing(args)
    if listing is not None:
        print(listing)
        return 0
    if not args.model:
        print(
            "error: --model is required (a Hub id, local folder, .gguf file or preset; see --list-presets)",
            file=sys.stderr,
        )
        return 2
    req = PlanRequest(
        model=args.model,
        gpu=args.gpu,
        num_gpus=args.num_gpus,
        tp=args.tp,
        pp=args.pp,
        quant=args.quant,
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=args.max_model_len,
        input_len=args.input_len,
        output_len=args.output_len,
        concurrency=args.concurrency,
        gpu_memory_utilization=args.gpu_memory_utilization,
        engine=args.engine,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        vllm_version=args.vllm_version,
        usage_context=args.usage_context,
        enforce_eager=args.enforce_eager,
    )
    try:
        result = estimate(req).to_dict()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0
