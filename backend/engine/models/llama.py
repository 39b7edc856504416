"""Llama (1/2/3.x, SmolLM2, TinyLlama), and Mistral and Qwen2 as registry aliases: the plain pre-norm
decoder of CausalLM, with biases and an untied lm_head as the checkpoint has them."""

from __future__ import annotations

from backend.engine.models.base import CausalLM


class LlamaForCausalLM(CausalLM):
    pass
