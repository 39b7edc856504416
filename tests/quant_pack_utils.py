"""The tiny random Llama the quantized-checkpoint tests pack (benchmarks/quant_checkpoints.py packs it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backend.engine import cpu_kernels

NATIVE = cpu_kernels.supports(torch.device("cpu"), torch.float32)  # the engine runs its CPU kernels


def count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """cpu_kernels.<name> wrapped to count its calls: [count], updated as the engine calls it."""
    calls, kernel = [0], getattr(cpu_kernels, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return kernel(*args, **kwargs)

    monkeypatch.setattr(cpu_kernels, name, counted)
    return calls


def tiny_dense_model(folder: Path) -> str:
    """A random Llama whose every linear has >= 128 inputs (group size 128 fits), saved with the default
    model's real tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tests.engine_utils import tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1,
        eos_token_id=2, tie_word_embeddings=False, initializer_range=0.25,
    )  # fmt: skip
    torch.manual_seed(13)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
