"""Build a random-weight Llama-family model folder from a config, for speed benchmarks on any machine.

    python -m backend.bench.random_model --out /tmp/llama-1b                # Llama-3.2-1B's shape
    python -m backend.bench.offline --model /tmp/llama-1b --device cuda     # then benchmark it

Speed does not depend on the weights' values, so a model of a real architecture's shape with random
weights measures what the real one would, without downloading anything. The tokenizer is the default
model's (SmolLM2, 49,152 tokens), saved beside the weights so the folder loads like any checkpoint.
"""

from __future__ import annotations

import argparse

# Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 query / 8 KV heads of 64, tied embeddings) with the
# SmolLM2 vocabulary: 1.07B parameters.
SHAPES = {
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
}


def build(out: str, shape: str = "llama-1b", tokenizer: str | None = None, seed: int = 0) -> str:
    """Write config, random bf16 weights and the tokenizer to `out`; returns `out`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from backend.default_model import default_model, split_gguf_path

    folder, gguf_file = split_gguf_path(tokenizer or default_model())
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tok = AutoTokenizer.from_pretrained(folder, **kwargs)
    config_cls, model_cls = (
        (Qwen2Config, Qwen2ForCausalLM)
        if shape.startswith("qwen2")
        else (
            LlamaConfig,
            LlamaForCausalLM,
        )
    )
    config = config_cls(
        vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **SHAPES[shape]
    )
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.bfloat16)
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
