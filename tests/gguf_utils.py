"""GGUF files for the tests: written by llama.cpp's own tools (convert_hf_to_gguf.py from a saved tiny
transformers model, then gguf-py's reference quantizer or llama-quantize; see the end of this file), or
tiny random Llama GGUF files in any mix of block types, written with gguf-py (the library llama.cpp's
converter uses), with the default model's real tokenizer and chat template copied in, cut to its first
VOCAB tokens and the merges that make them (merge i makes token 252 + i), so that it loads in a second.

Q4_0, Q4_1, Q8_0 and Q5_0 tensors are quantized from random fp32 weights by gguf-py's own quantizer;
gguf-py has no quantizer for the K-types, so Q4_K, Q6_K (and MXFP4) are random blocks with small scales:
valid blocks in the published layout (every byte pattern decodes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter, quantize

from backend.bench.llamacpp_tools import (  # noqa: F401 (the tests' import point)
    CONVERTER_TYPES,
    convert_hf_to_gguf,
    llama_cpp_dir,
    llama_quantize,
)
from backend.default_model import packaged_gguf

Q = GGMLQuantizationType
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 256, 512, 2, 4, 2  # K-types need rows of 256
VOCAB, FIRST_MERGED_TOKEN = 2048, 252
LINEAR_KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, cols / block_size * type_size] uint8 of the given type."""
    if qtype in (Q.F32, Q.F16):
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32 if qtype == Q.F32 else np.float16)
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0):
        return quantize((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32), qtype)
    size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows, cols // size, type_size), dtype=np.uint8)
    scales = rng.uniform(2e-5, 1e-4, (rows, cols // size, 2)).astype(np.float16).view(np.uint8)  # 2 halves
    if qtype == Q.Q4_K:  # d, then dmin
        blocks[:, :, 0:4] = scales
    elif qtype == Q.Q6_K:  # d last (values below 6e-5 exercise half subnormals)
        blocks[:, :, 208:210] = scales[..., :2]
    elif qtype == Q.MXFP4:  # E8M0 exponent first: 2^-8 .. 2^-4 with E2M1 values up to 12 (ggml's doubled)
        blocks[:, :, 0] = rng.integers(120, 125, (rows, cols // size))
    else:
        raise ValueError(f"no random blocks for {qtype.name}")
    return blocks.reshape(rows, -1)


def shape_of(kind: str) -> tuple[int, int]:
    head_dim = HIDDEN // HEADS
    return {
        "attn_q": (HIDDEN, HIDDEN),
        "attn_k": (KV_HEADS * head_dim, HIDDEN),
        "attn_v": (KV_HEADS * head_dim, HIDDEN),
        "attn_output": (HIDDEN, HIDDEN),
        "ffn_gate": (INTERMEDIATE, HIDDEN),
        "ffn_up": (INTERMEDIATE, HIDDEN),
        "ffn_down": (HIDDEN, INTERMEDIATE),
    }[kind]


def write_tiny_gguf(
    path: Path, types: dict[str, GGMLQuantizationType], embedding: GGMLQuantizationType, output=None, seed=0
) -> Path:
    """A 2-layer Llama: linear kinds in types (default Q8_0), the embedding in `embedding`, and an untied
    output projection of type `output` when given (tied otherwise)."""
    rng = np.random.default_rng(seed)
    source = GGUFReader(packaged_gguf())
    vocab = VOCAB
    cut = {"tokenizer.ggml.tokens": VOCAB, "tokenizer.ggml.token_type": VOCAB}
    cut["tokenizer.ggml.merges"] = VOCAB - FIRST_MERGED_TOKEN
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(2048)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    for key, field in source.fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[1] if len(field.types) > 1 else None
            value = field.contents()
            writer.add_key_value(key, value[: cut[key]] if key in cut else value, field.types[0], sub_type)
    add = lambda name, qtype, rows, cols: writer.add_tensor(  # noqa: E731
        name, random_blocks(qtype, rows, cols, rng), raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype
    )
    add("token_embd.weight", embedding, vocab, HIDDEN)
    for layer in range(LAYERS):
        for kind in LINEAR_KINDS:
            add(f"blk.{layer}.{kind}.weight", types.get(kind, Q.Q8_0), *shape_of(kind))
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(
                f"blk.{layer}.{norm}.weight", 1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32)
            )
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    if output is not None:
        add("output.weight", output, vocab, HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --- GGUF files written by llama.cpp's own tools, from the llama-cpp-python sdist (`make llama-cpp-src`):
# convert_hf_to_gguf, llama_cpp_dir, llama_quantize (backend/bench/llamacpp_tools.py, which the speed
# benchmarks share)


def requantize(path: Path, qtype: GGMLQuantizationType) -> Path:
    """The file with every F32/F16 matrix (2-D, or 3-D stacked experts) quantized to qtype by gguf-py's
    reference quantizer (the rounding of llama.cpp's quantize_row_*_ref), as `llama-quantize --pure` does;
    the router (ffn_gate_inp, never quantized by llama-quantize) and 1-D tensors stay as they are."""
    out = path.with_name(path.name.replace(".gguf", f"-{qtype.name}.gguf"))
    if out.is_file():
        return out
    source = GGUFReader(path)
    writer = GGUFWriter(str(out), source.fields["general.architecture"].contents())
    for key, field in source.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub_type = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type)
    for tensor in source.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        data = np.array(tensor.data)
        matrix = len(shape) >= 2 and shape[-1] % GGML_QUANT_SIZES[qtype][0] == 0
        if matrix and "ffn_gate_inp" not in tensor.name and tensor.tensor_type in (Q.F32, Q.F16):
            writer.add_tensor(
                tensor.name, quantize(data.astype(np.float32).reshape(shape), qtype), raw_dtype=qtype
            )
        else:
            writer.add_tensor(tensor.name, data.reshape(shape), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
