"""The speed benchmarks' GGUF files: a random-weight model of a real architecture's shape (random_model.py),
converted by llama.cpp's own converter to BF16 and quantized by its llama-quantize, so that our engine and
llama.cpp read the very same file. Built once (minutes: the converter and llama-quantize on a 1B model),
then kept under ~/.cache/llm-playground/bench-models/ (XDG_CACHE_HOME), outside git.

    python -m backend.bench.bench_models --shape llama-3.2-1b --type Q4_0            # the default mix
    python -m backend.bench.bench_models --shape llama-3.2-1b --type Q4_0 --pure     # every matrix Q4_0
    python -m backend.bench.bench_models --shape olmoe-1b-7b-4l --type Q4_0          # the MoE row (issue 30)

llama-quantize's default Q4_0 mix keeps the types its rules pick per tensor (src/llama-quant.cpp
llama_tensor_get_type): the output matrix, or a tied embedding that serves as it, becomes Q6_K (Q8_0
when its row is not a multiple of 256); --pure makes every matrix the one type.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from backend.bench import random_model
from backend.bench.llamacpp_tools import convert_hf_to_gguf, llama_quantize


def models_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "llm-playground" / "bench-models"


def bench_gguf(shape: str, type_name: str = "Q4_0", pure: bool = False) -> Path:
    """The shape's random model as a GGUF file of llama-quantize's type_name (its default mix, or --pure)."""
    if shape not in random_model.SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(sorted(random_model.SHAPES))}")
    folder = models_dir() / shape
    if not (folder / "tokenizer_config.json").is_file():  # written last: a folder without it is partial
        shutil.rmtree(folder, ignore_errors=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        random_model.build(str(folder), shape)
    bf16 = convert_hf_to_gguf(folder, "bf16")["bf16"]
    return llama_quantize(bf16, type_name, *(["--pure"] if pure else []))


def tensor_types(path: Path) -> dict[str, int]:
    """{GGML type name: tensors of that type} in the file."""
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for tensor in GGUFReader(path).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return counts


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(random_model.SHAPES), default="llama-3.2-1b")
    parser.add_argument("--type", default="Q4_0", help="llama-quantize's type name")
    parser.add_argument("--pure", action="store_true", help="every matrix in --type (no mix)")
    args = parser.parse_args()
    path = bench_gguf(args.shape, args.type, args.pure)
    print(f"{path} ({path.stat().st_size / 1e9:.2f} GB): {tensor_types(path)}")
