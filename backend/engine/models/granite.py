"""IBM Granite (3.x dense): Llama's decoder with four constants from its config. The embeddings are
multiplied by embedding_multiplier, attention_multiplier is the softmax scale, each attention and MLP
output is multiplied by residual_multiplier before the residual add, and the logits are divided by
logits_scaling. CausalLM.fold_scales folds them into the weights, so Granite runs on Llama's kernels and
its captured decode step."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from backend.engine.models.args import ModelArgs
from backend.engine.models.base import CausalLM


class GraniteForCausalLM(CausalLM):
    @classmethod
    def args_from_config(cls, hf_config: Any, weight_names: Collection[str]) -> ModelArgs:
        scaling = hf_config.logits_scaling
        if not isinstance(scaling, int | float) or not math.isfinite(scaling) or scaling <= 0:
            raise ValueError(
                f"config.json's logits_scaling must be a positive finite number, got {scaling!r}"
            )
        return replace(
            ModelArgs.from_hf_config(hf_config, weight_names),
            attention_scale=hf_config.attention_multiplier,
            embedding_multiplier=hf_config.embedding_multiplier,
            residual_multiplier=hf_config.residual_multiplier,
            logits_multiplier=1.0 / scaling,
        )
