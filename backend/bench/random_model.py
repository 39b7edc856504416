"""Build a random-weight Llama-family (or OLMoE) model folder from a config, for speed benchmarks.

    python -m backend.bench.random_model --out /tmp/llama-1b                # Llama-3.2-1B's shape
    python -m backend.bench.offline --model /tmp/llama-1b --device cuda     # then benchmark it

Speed does not depend on the weights' values, so a model of a real architecture's shape with random
weights measures what the real one would, without downloading anything. The tokenizer is the default
model's (SmolLM2, 49,152 tokens), saved beside the weights so the folder loads like any checkpoint; a shape
with a larger vocab_size keeps its own (the embedding and lm_head have the real model's rows; llama.cpp's
converter fills the ids past the tokenizer's with [PAD<id>] tokens). Weights take transformers' own
initialisation (normal, std initializer_range 0.02): logits over a 128k vocabulary spread by about
0.02 * sqrt(hidden) after the final norm, far from flat.
"""

from __future__ import annotations

import argparse
from typing import Any

# Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 query / 8 KV heads of 64, tied embeddings) with the
# SmolLM2 vocabulary: 1.07B parameters.
SHAPES: dict[str, dict[str, Any]] = {
    # Llama-3.2-1B exactly (its config.json): vocabulary 128,256, llama3 RoPE scaling; 1.24B parameters
    "llama-3.2-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=500000.0,
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
    ),
    "llama-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
    "qwen2-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
    # OLMoE-1B-7B's shape (allenai/OLMoE-1B-7B-0924 config.json: hidden 2048, 16 heads of 128, 64 experts
    # of intermediate 1024, top-8, vocabulary 50,304, untied) with 4 of its 16 layers: 1.9B parameters
    # (all 16: 6.9B, 14 GB in bf16, past this machine's memory with both engines loaded)
    "olmoe-1b-7b-4l": dict(
        vocab_size=50304,
        hidden_size=2048,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=16,
        num_experts=64,
        num_experts_per_tok=8,
        norm_topk_prob=False,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    ),
}


def build(out: str, shape: str = "llama-1b", tokenizer: str | None = None, seed: int = 0) -> str:
    """Write config, random bf16 weights and the tokenizer to `out`; returns `out`."""
    import torch
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        OlmoeConfig,
        OlmoeForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    from backend.default_model import default_model, split_gguf_path

    folder, gguf_file = split_gguf_path(tokenizer or default_model())
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tok = AutoTokenizer.from_pretrained(folder, **kwargs)
    families = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "olmoe": (OlmoeConfig, OlmoeForCausalLM)}
    config_cls, model_cls = families.get(shape.split("-")[0], (LlamaConfig, LlamaForCausalLM))
    config = config_cls(
        **({"vocab_size": len(tok)} | SHAPES[shape]),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    model = model_cls._from_config(config, dtype=torch.bfloat16)  # built in bf16: no fp32 copy
    model.save_pretrained(out)
    tok.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{shape}: {params / 1e9:.2f}B parameters written to {out}", flush=True)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-1b")
    parser.add_argument("--tokenizer", default=None, help="tokenizer source (default: the default model)")
    args = parser.parse_args()
    build(args.out, args.shape, args.tokenizer)
