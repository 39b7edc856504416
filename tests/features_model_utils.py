"""A tiny model whose layers use every per-layer attention feature at once (no tests here): layer 0 rotates
half of each head (partial rotary) with a logit soft-cap and attention sinks, layer 1 has no RoPE and a
sliding window, both with a GELU(tanh) MLP. No registered family has this mix; the class is a test's
CausalLM that declares it through the `attention_spec` hook, as Gemma 2/3, Phi-3, SmolLM3 and gpt-oss will.
Its checkpoint is the tiny "llama_gelu" model's plus the sinks tensor."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from dataclasses import replace
from functools import cache
from pathlib import Path

import torch

from backend.engine.layers.attention import AttentionSpec
from backend.engine.layers.rotary import RopeSpec
from backend.engine.models.llama import LlamaForCausalLM
from tests.engine_utils import WINDOW, tiny_model

SOFT_CAP = 2.0  # well below the tiny model's scores, so that capping changes them
SINKS_NAME = "model.layers.0.self_attn.sinks"
_ROOT = Path(tempfile.mkdtemp(prefix="features-model-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


class FeaturesForCausalLM(LlamaForCausalLM):
    def attention_spec(self, layer: int) -> AttentionSpec:
        spec = super().attention_spec(layer)
        if layer == 0:
            return replace(spec, rope=RopeSpec(spec.head_dim // 2), logits_soft_cap=SOFT_CAP, has_sinks=True)
        return replace(spec, rope=None, sliding_window=WINDOW)


@cache
def features_model() -> str:
    """The folder of the tiny features model: llama_gelu's files and one more shard, with the sinks."""
    source, model = tiny_model("llama_gelu")
    folder = _ROOT / "features"
    shutil.copytree(source, folder)
    from safetensors.torch import save_file

    heads = model.config.num_attention_heads
    sinks = torch.linspace(-1.0, 2.0, heads)  # some heads' sinks above their scores, some below
    save_file({SINKS_NAME: sinks}, folder / "sinks.safetensors")
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"][SINKS_NAME] = "sinks.safetensors"
    index_path.write_text(json.dumps(index))
    return str(folder)
