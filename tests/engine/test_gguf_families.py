"""GGUF files of every family as llama.cpp's own converter writes them (tests/gguf_family_utils.py), read
by the engine's GGUF reader: the config, every tensor and the tokenizer's chat template against the
transformers checkpoint the file was converted from. No engine model code is involved.

F32 tensors are equal bit for bit (after undoing the converter's q/k permutation; Gemma's norms, stored
with 1 added, within one float32 rounding of 1); F16 equal to the checkpoint rounded to half; Q8_0 (the
converter's) and Q4_0 (the F32 file requantized) within half a quantization step of each row's largest
weight, decoded from the blocks the reader keeps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf import dequantize as gguf_dequantize
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

from backend.engine import gguf_cache
from backend.engine.gguf.families import ROPE_TENSORS, family_of
from backend.engine.gguf.hf_config import config_dict
from backend.engine.gguf.metadata import read_metadata
from backend.engine.gguf.tensor_names import hf_name
from backend.engine.gguf.tokenizer import gguf_tokenizer
from backend.engine.quantization.gguf_blocks import dequantize
from backend.engine.quantization.gguf_reader import QuantizedWeight, read_gguf_tensors
from tests.gguf_family_utils import (
    FAMILIES,
    MOE_FAMILIES,
    VARIANTS,
    family_gguf,
    tiny_family_model,
    tiny_gpt_oss_mxfp4,
)
from tests.gguf_utils import convert_hf_to_gguf, random_blocks

# what each quantized type's rounding may move a weight by, as a fraction of its row's largest |weight|:
# half a step absmax / 127 (Q8_0, rounded); one step absmax / 8 (Q4_0: -8..7, +absmax clips to 7); plus the
# block scale stored in half precision
STEP = {"q8_0": 0.5 / 127 + 1e-3, "q4_0": 1 / 8 + 1e-3}
# config fields the file does not carry, or carries from the tokenizer rather than the model config
NOT_IN_GGUF = {
    "transformers_version",
    "_name_or_path",
    "dtype",
    "initializer_range",
    "use_cache",
    "pad_token_id",
}
NOT_IN_GGUF |= {"output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "attention_dropout"}
CHAT = [  # no system turn: Gemma's template refuses one
    {"role": "user", "content": "Hello there, ünïcödé 123?"},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "And now?"},
]


@pytest.fixture(autouse=True, scope="module")
def private_cache(tmp_path_factory):
    """One cache for the module: each file's tensor table is parsed once (49k vocabulary strings)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


def checkpoint_tensors(family: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the reader's names: experts stacked per projection as [E, out, in]."""
    state = load_file(f"{tiny_family_model(family)}/model.safetensors")
    stacked: dict[str, list[tuple[int, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    renames = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}  # Mixtral's expert names
    for name, tensor in state.items():
        parts = name.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():  # .experts.<e>.<proj>.weight
            at = parts.index("experts")
            key = ".".join([*parts[: at + 1], renames.get(parts[at + 2], parts[at + 2])])
            stacked.setdefault(key, []).append((int(parts[at + 1]), tensor))
        elif name.endswith("input_linear.weight"):  # granitemoe: [E, 2I, H], gate rows then up rows
            prefix = name.removesuffix("input_linear.weight") + "experts."
            out[prefix + "gate_proj"], out[prefix + "up_proj"] = tensor.chunk(2, dim=1)
        elif name.endswith("output_linear.weight"):
            out[name.removesuffix("output_linear.weight") + "experts.down_proj"] = tensor
        elif name.endswith("experts.gate_up_proj"):  # gpt-oss: [E, H, 2I], gate and up interleaved
            out[name.replace("gate_up_proj", "gate_proj")] = tensor.transpose(1, 2)[:, 0::2]
            out[name.replace("gate_up_proj", "up_proj")] = tensor.transpose(1, 2)[:, 1::2]
        elif name.endswith("experts.gate_up_proj_bias"):
            out[name.replace("gate_up_proj", "gate_proj")] = tensor[:, 0::2]
            out[name.replace("gate_up_proj", "up_proj")] = tensor[:, 1::2]
        elif name.endswith("experts.down_proj"):  # gpt-oss: [E, I, H]
            out[name] = tensor.transpose(1, 2)
        else:
            out[name] = tensor
    for key, experts in stacked.items():
        out[key] = torch.stack([tensor for _, tensor in sorted(experts, key=lambda item: item[0])])
    return out


@pytest.mark.parametrize("family", FAMILIES + VARIANTS)
def test_config_from_the_file_is_the_checkpoints(family):
    path = family_gguf(family, "f32")
    ours = AutoConfig.for_model(**config_dict(read_metadata(str(path)))).to_dict()
    reference = AutoConfig.from_pretrained(tiny_family_model(family)).to_dict()
    if reference.get("head_dim") is None:  # Mixtral leaves it to hidden_size / heads
        reference["head_dim"] = reference["hidden_size"] // reference["num_attention_heads"]
    differ = {k: (ours.get(k), v) for k, v in reference.items() if k not in NOT_IN_GGUF and ours.get(k) != v}
    assert differ == {}
    assert ours["architectures"] == reference["architectures"]


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_tensor_has_the_checkpoints_name_and_value(family, outtype):
    path = str(family_gguf(family, outtype))
    config = AutoConfig.for_model(**config_dict(read_metadata(path)))
    plain, quantized = read_gguf_tensors(path, config)
    expected = checkpoint_tensors(family)
    assert set(plain) | set(quantized) == set(expected)
    assert not set(plain) & set(quantized)
    if outtype in ("f32", "f16"):
        assert quantized == {}
    else:  # the converter keeps norms, biases and routers in F32; the matrices are blocks
        assert {w.qtype for w in quantized.values()} == {outtype}
        assert any(".experts." in name for name in quantized) == (".experts." in " ".join(expected))
    stored_as = file_types(path)
    for name, value in plain.items():
        half = stored_as[name] == GGMLQuantizationType.F16  # the converter keeps 1-D tensors and routers F32
        want = expected[name].half().float() if half else expected[name]
        if name.endswith("norm.weight") and family == "gemma3":  # stored as 1 + w in float32
            torch.testing.assert_close(value, want, rtol=0, atol=2**-23)
        else:
            assert torch.equal(value, want), name
    for name, weight in quantized.items():
        assert_blocks_encode(name, weight, expected[name], STEP[outtype])


def file_types(path: str) -> dict[str, GGMLQuantizationType]:
    """Each tensor's type in the file, by the reader's name for it."""
    architecture, tensors = gguf_cache.tensors(path)
    family = family_of(architecture, any(t.name.endswith("_exps.weight") for t in tensors))
    return {hf_name(family, t.name): t.tensor_type for t in tensors if t.name not in ROPE_TENSORS}


def assert_blocks_encode(name: str, weight: QuantizedWeight, want: torch.Tensor, step: float) -> None:
    """weight's blocks, decoded, are want (any [..., k]) within step x each row's largest |weight|."""
    rows = want.reshape(-1, want.shape[-1])
    assert weight.shape == tuple(rows.shape), name
    decoded = dequantize(weight.data, weight.qtype)
    tolerance = rows.abs().amax(dim=1, keepdim=True) * step
    assert bool(((decoded - rows).abs() <= tolerance).all()), name


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tokenizer_renders_the_files_chat_template(family):
    ours = gguf_tokenizer(str(family_gguf(family, "f32")))
    reference = AutoTokenizer.from_pretrained(tiny_family_model(family))
    assert ours.chat_template == reference.chat_template
    text = ours.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert text == reference.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert (
        ours(text, add_special_tokens=False).input_ids == reference(text, add_special_tokens=False).input_ids
    )
    assert (ours.bos_token, ours.eos_token) == (reference.bos_token, reference.eos_token)
    assert (
        ours("Hello world").input_ids == reference("Hello world").input_ids
    )  # add_bos_token as the file says


def test_mxfp4_pytorch_decoding_equals_gguf_py():
    """gguf_blocks' MXFP4 decoder against gguf-py's (which follows ggml's dequantize_row_mxfp4)."""
    data = random_blocks(GGMLQuantizationType.MXFP4, 16, 256, np.random.default_rng(0))
    data[0, 0], data[1, 0], data[2, 0] = 0, 1, 254  # the smallest scales (float32 subnormals) and a large one
    reference = torch.from_numpy(gguf_dequantize(data, GGMLQuantizationType.MXFP4))
    assert torch.equal(dequantize(torch.from_numpy(data), "mxfp4"), reference)


def unpacked(state: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """transformers' dequantization of a checkpoint's MXFP4 <name>_blocks / _scales, as [E, out, in]."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    in_out = convert_moe_packed_tensors(state[f"{name}_blocks"], state[f"{name}_scales"], dtype=torch.float32)
    return in_out.transpose(1, 2)


def test_mxfp4_experts_stay_blocks_that_decode_as_transformers_decodes_the_checkpoint():
    """gpt-oss's MXFP4 experts, repacked by the converter (conversion/gpt_oss.py repack_mxfp4), reach the
    engine as MXFP4 blocks whose values are transformers' own dequantization of the checkpoint."""
    folder = tiny_gpt_oss_mxfp4()
    path = str(convert_hf_to_gguf(folder, "f32")["f32"])
    plain, quantized = read_gguf_tensors(path, AutoConfig.for_model(**config_dict(read_metadata(path))))
    state = load_file(f"{folder}/model.safetensors")
    assert {name for name in quantized} == {n for n in checkpoint_tensors("gpt-oss") if n.endswith("_proj")}
    for layer in range(2):
        prefix = f"model.layers.{layer}.mlp.experts."
        gate_up = unpacked(state, prefix + "gate_up_proj")
        expected = {
            "gate_proj": gate_up[:, 0::2],
            "up_proj": gate_up[:, 1::2],
            "down_proj": unpacked(state, prefix + "down_proj"),
        }
        for projection, want in expected.items():
            weight = quantized[prefix + projection]
            rows = want.reshape(-1, want.shape[-1])
            assert weight.qtype == "mxfp4" and weight.shape == tuple(rows.shape)
            assert weight.data.shape == (rows.shape[0], rows.shape[1] // 32 * 17)  # 17-byte blocks of 32
            assert torch.equal(dequantize(weight.data, "mxfp4"), rows)
        assert torch.equal(
            plain[prefix + "gate_proj_bias"], checkpoint_tensors("gpt-oss")[prefix + "gate_proj_bias"]
        )


@pytest.mark.parametrize("family", FAMILIES + VARIANTS)
def test_the_planner_reads_the_file_as_it_reads_the_checkpoint(family):
    """KV per token from the real kv heads, head width and sliding layers; MoE active against total."""
    from backend.planner.sources import load_model_spec

    from_file = load_model_spec(str(family_gguf(family, "f32")))
    from_folder = load_model_spec(tiny_family_model(family))
    fields = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    fields += ("vocab_size", "attention", "sliding_window", "layer_types", "tie_word_embeddings")
    fields += ("partial_rotary_factor",)
    fields += ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "params_total", "params_active")
    assert {f: getattr(from_file, f) for f in fields} == {f: getattr(from_folder, f) for f in fields}
    assert from_file.checkpoint_dtype == "gguf-all_f32"
    if family in MOE_FAMILIES:
        assert from_file.params_active < from_file.params_total
