"""IBM Granite-MoE (granite-3.x-*-a*m): Granite's decoder and multipliers (models/granite.py) with a MoE
block in every layer (top-k router logits, then a softmax over them; fused_moe/config.py). The residual
multiplier is folded into the down experts where they are dense, else the block applies it to its output
(FusedMoE.scale_output)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from backend.engine.models.args import ModelArgs
from backend.engine.models.granite import GraniteForCausalLM
from backend.engine.models.moe import MoECausalLM


class GraniteMoeForCausalLM(MoECausalLM):
    @classmethod
    def args_from_config(cls, hf_config: Any, weight_names: Collection[str]) -> ModelArgs:
        return GraniteForCausalLM.args_from_config(hf_config, weight_names)
