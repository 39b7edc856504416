"""Qwen3: Llama's decoder with a per-head RMSNorm of q and k before RoPE (its registry traits say qk_norm,
which the captured decode step has no kernel for)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

from backend.engine.models.args import ModelArgs
from backend.engine.models.base import CausalLM


class Qwen3ForCausalLM(CausalLM):
    @classmethod
    def args_from_config(cls, hf_config: Any, weight_names: Collection[str]) -> ModelArgs:
        return replace(ModelArgs.from_hf_config(hf_config, weight_names), qk_norm=True)
