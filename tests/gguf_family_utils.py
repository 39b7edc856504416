"""Tiny random transformers models of every family llama.cpp's converter writes, saved with save_pretrained,
and their GGUF files written by that converter (tests/gguf_utils.py), once per session.

    folder = tiny_family_model("gemma3")             # a transformers folder (config, safetensors, tokenizer)
    path = family_gguf("gemma3", "f32")              # llama.cpp's GGUF of it: f32, f16, bf16, q8_0 (the
                                                     # first call writes f32, f16 and q8_0 in one process)
    path = family_gguf("gemma3", "q4_0")             # the f32 file requantized (gguf_utils.requantize)

Every model has the default model's tokenizer (SmolLM2's byte-level BPE, which llama.cpp's converter knows
as "smollm"), with the chat template of the family's real model from llama.cpp's models/templates where it
ships one. Norm weights are random (not transformers' ones / zeros), so that Gemma's +1 shows. The
configs hold what llama.cpp assumes for a family and the file does not state: Gemma 3's query scale
1/sqrt(head_dim) and sliding pattern 6, Qwen3-MoE's normalised top-k, SmolLM3's RoPE-less 4th layer.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from functools import cache
from pathlib import Path

import torch

from tests.engine_utils import tokenizer_dir
from tests.gguf_utils import CONVERTER_TYPES, Q, convert_hf_to_gguf, llama_cpp_dir, requantize

FAMILIES = (
    "llama",
    "qwen3",
    "gemma3",
    "phi3",
    "smollm3",
    "granite",
    "olmo2",
    "mixtral",
    "qwen3moe",
    "olmoe",
    "granitemoe",
    "gpt-oss",
)
VARIANTS = ("phi3-longrope",)  # a family's other shape: config and planner tests only
MOE_FAMILIES = ("mixtral", "qwen3moe", "olmoe", "granitemoe", "gpt-oss")
# the real models' chat templates, as llama.cpp keeps them for its own tests (models/templates/)
TEMPLATES = {
    "llama": "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "qwen3": "Qwen-Qwen3-0.6B.jinja",
    "gemma3": "google-gemma-2-2b-it.jinja",  # Gemma 3's template is Gemma 2's, plus image handling
    "phi3": "microsoft-Phi-3.5-mini-instruct.jinja",
    "smollm3": "HuggingFaceTB-SmolLM3-3B.jinja",
    "granite": "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "granitemoe": "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "mixtral": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "qwen3moe": "Qwen-Qwen3-0.6B.jinja",
    "gpt-oss": "openai-gpt-oss-120b.jinja",
}
TESTED_TYPES = ("f32", "f16", "q8_0")
_ROOT = Path(tempfile.mkdtemp(prefix="gguf-families-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)
_MULTIPLIERS = dict(
    embedding_multiplier=12.0, attention_multiplier=0.125, residual_multiplier=0.25, logits_scaling=4.0
)


def family_config(family: str, vocab_size: int):
    import transformers as t

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.25,
    )
    experts = dict(num_experts_per_tok=2)
    builders = {
        "llama": lambda: t.LlamaConfig(**common),
        "qwen3": lambda: t.Qwen3Config(**common, head_dim=32),
        "mistral": lambda: t.MistralConfig(**common),  # the converter writes it as "llama"
        "gemma3": lambda: t.Gemma3TextConfig(
            **common | dict(num_hidden_layers=7, tie_word_embeddings=True),
            head_dim=32,
            query_pre_attn_scalar=32,
            sliding_window=16,
            final_logit_softcapping=30.0,
        ),
        "phi3": lambda: t.Phi3Config(**common),
        "phi3-longrope": lambda: t.Phi3Config(  # Phi-3.5 / Phi-4-mini: factors per rotary frequency
            **common | dict(max_position_embeddings=1024),
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                partial_rotary_factor=0.5,
                original_max_position_embeddings=256,
                long_factor=[1.0 + i / 4 for i in range(4)],
                short_factor=[1.0 + i / 8 for i in range(4)],
            ),
        ),
        "smollm3": lambda: t.SmolLM3Config(**common | dict(num_hidden_layers=4)),
        "granite": lambda: t.GraniteConfig(**common, **_MULTIPLIERS),
        "olmo2": lambda: t.Olmo2Config(**common),
        "mixtral": lambda: t.MixtralConfig(**common, num_local_experts=4, **experts),
        "qwen3moe": lambda: t.Qwen3MoeConfig(
            **common, head_dim=32, num_experts=4, moe_intermediate_size=32, norm_topk_prob=True, **experts
        ),
        "olmoe": lambda: t.OlmoeConfig(**common, num_experts=4, **experts),
        "granitemoe": lambda: t.GraniteMoeConfig(**common, num_local_experts=4, **_MULTIPLIERS, **experts),
        "gpt-oss": lambda: t.GptOssConfig(
            **common | dict(intermediate_size=64),
            head_dim=32,
            num_local_experts=4,
            sliding_window=16,
            **experts,
        ),
    }
    return builders[family]()


@cache
def tiny_family_model(family: str) -> str:
    """A saved tiny random model of the family (fp32 safetensors, tokenizer with the family's template)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    if family in TEMPLATES:
        tokenizer.chat_template = (llama_cpp_dir() / "models" / "templates" / TEMPLATES[family]).read_text()
    torch.manual_seed(sum(map(ord, family)))
    model = AutoModelForCausalLM.from_config(family_config(family, len(tokenizer)), dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or "sinks" in name or name.endswith("bias"):
                parameter.normal_(0.0, 0.5)
    folder = _ROOT / family
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if family.startswith("phi3"):  # Phi-4's byte-level BPE path (Phi-3's needs a sentencepiece model)
        settings = folder / "tokenizer_config.json"
        settings.write_text(
            json.dumps(json.loads(settings.read_text()) | {"tokenizer_class": "GPT2Tokenizer"})
        )
    return str(folder)


@cache
def family_gguf(family: str, outtype: str) -> Path:
    """llama.cpp's GGUF of the family's tiny model: a converter type, or q4_0 (the f32 file requantized)."""
    if outtype in CONVERTER_TYPES:  # the types the tests read, in one converter process
        return convert_hf_to_gguf(tiny_family_model(family), *TESTED_TYPES, outtype)[outtype]
    if outtype == "q4_0":
        return requantize(family_gguf(family, "f32"), Q.Q4_0)
    raise ValueError(f"outtype must be one of {', '.join(CONVERTER_TYPES)} or q4_0; got {outtype!r}")


@cache
def tiny_gpt_oss_mxfp4() -> str:
    """The tiny gpt-oss with its experts in MXFP4 as openai's checkpoints ship them: <proj>_blocks
    [E, out, in / 32, 16] uint8 (two E2M1 values a byte, the even element in the low nibble) and
    <proj>_scales [E, out, in / 32] uint8 (E8M0, bias 127), with quantization_config quant_method mxfp4.
    The blocks are random bytes (every byte is a valid pair of E2M1 values) under scales near 2^-5."""
    from safetensors.torch import load_file, save_file

    folder = _ROOT / "gpt-oss-mxfp4"
    shutil.copytree(tiny_family_model("gpt-oss"), folder)
    state = load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(39)
    for name in [n for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, k, n = state.pop(name).shape  # transformers keeps these as [E, in, out]
        state[f"{name}_blocks"] = torch.randint(
            0, 256, (experts, n, k // 32, 16), dtype=torch.uint8, generator=generator
        )
        state[f"{name}_scales"] = torch.randint(
            118, 126, (experts, n, k // 32), dtype=torch.uint8, generator=generator
        )
    save_file(state, folder / "model.safetensors")
    config_file = folder / "config.json"
    quantization = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"],
    }
    config_file.write_text(
        json.dumps(json.loads(config_file.read_text()) | {"quantization_config": quantization})
    )
    return str(folder)
