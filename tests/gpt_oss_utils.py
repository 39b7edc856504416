"""A tiny random gpt-oss (GptOssForCausalLM) saved with save_pretrained, and the same model with its experts
in MXFP4 as openai's checkpoints ship them (no tests here).

    folder = tiny_gpt_oss()          # fp32 safetensors: 4 layers (sliding 8 / full alternating), 4 experts,
                                     # top-2, head_dim 16, YaRN as gpt-oss-20b's config.json has it
    folder = tiny_gpt_oss_mxfp4()    # the same, its experts' gate_up_proj / down_proj as _blocks / _scales

The tokenizer is the default model's byte-level BPE with harmony's control tokens and gpt-oss's chat
template (tests/harmony_utils.py: openai's o200k_harmony tokenizer is on the Hub, which tests cannot reach),
eos <|return|>. Biases, sinks and norms are drawn at scale 0.5 (transformers' init leaves biases at zero),
so that each shows in the outputs.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from functools import cache
from pathlib import Path

import torch

from tests.harmony_utils import harmony_tokenizer

_ROOT = Path(tempfile.mkdtemp(prefix="gpt-oss-tests-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)
SLIDING_WINDOW = 8
# openai/gpt-oss-20b's config.json: YaRN over an original 4096 positions, factor 32
ROPE = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
}
# what openai's checkpoints leave unquantized (gpt-oss-20b's quantization_config)
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def gpt_oss_config(vocab_size: int, eos_token_id: int):
    from transformers import GptOssConfig

    return GptOssConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"] * 2,
        max_position_embeddings=131072,
        rope_parameters=ROPE,
        eos_token_id=eos_token_id,
        pad_token_id=0,
        initializer_range=0.25,
    )


@cache
def tiny_gpt_oss() -> str:
    from transformers import AutoModelForCausalLM

    tokenizer = harmony_tokenizer()
    config = gpt_oss_config(len(tokenizer), tokenizer.convert_tokens_to_ids("<|return|>"))
    torch.manual_seed(20)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or "sinks" in name or name.endswith("bias"):
                parameter.normal_(0.0, 0.5)
    folder = _ROOT / "gpt-oss"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@cache
def tiny_gpt_oss_mxfp4() -> str:
    """tiny_gpt_oss with its experts in openai's MXFP4 layout: <proj>_blocks [E, out, in / 32, 16] uint8 (two
    E2M1 values a byte, the even element in the low nibble) and <proj>_scales [E, out, in / 32] uint8 (E8M0,
    bias 127), quantization_config {"quant_method": "mxfp4", "modules_to_not_convert": [...]}. The blocks are
    random bytes (every byte is a pair of valid E2M1 codes) under scales 2^-7 .. 2^-4."""
    from safetensors.torch import load_file, save_file

    folder = _ROOT / "gpt-oss-mxfp4"
    shutil.copytree(tiny_gpt_oss(), folder)
    state = load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(21)
    for name in [n for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, k, n = state.pop(name).shape  # save_pretrained's [E, in, out]
        state[f"{name}_blocks"] = torch.randint(
            0, 256, (experts, n, k // 32, 16), dtype=torch.uint8, generator=generator
        )
        state[f"{name}_scales"] = torch.randint(
            120, 124, (experts, n, k // 32), dtype=torch.uint8, generator=generator
        )
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config_file = folder / "config.json"
    quantization = {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}
    config_file.write_text(
        json.dumps(json.loads(config_file.read_text()) | {"quantization_config": quantization})
    )
    return str(folder)
