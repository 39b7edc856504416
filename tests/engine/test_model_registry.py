"""The model registry (architecture name -> class, traits the planner reads without torch), the checks a
config.json passes before the model is allocated, and the shared layers' variants against transformers:
partial rotary, RoPE tables per layer type, windows, soft-caps and sinks reaching paged_attention, and the
refusal of an attention option the path does not take."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from backend.engine import LLM
from backend.engine.attention import AttentionMetadata, PrefillChunk
from backend.engine.cpu_kernels import PrefillKernelInputs
from backend.engine.decode_graph_support import unsupported_layer
from backend.engine.layers import attention as attention_layer
from backend.engine.layers.attention import PAGED_ATTENTION_OPTIONS, Attention, AttentionSpec
from backend.engine.layers.decoder import DecoderLayer, SandwichDecoderLayer
from backend.engine.layers.mlp import GatedMLP
from backend.engine.layers.rotary import RopeSpec, RopeTables, apply_rope, rope_table
from backend.engine.loader import load_model
from backend.engine.models.base import CausalLM
from backend.engine.models.registry import (
    MODELS,
    model_class,
    resolve_architecture,
    supported_architectures,
    traits_of,
)
from tests.attention_utils import Features, reference_attention
from tests.common_utils import ROOT
from tests.engine_utils import ARCHITECTURES, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_architectures_first_then_model_type():
    config = SimpleNamespace(architectures=["NotAModel", "Qwen2ForCausalLM"], model_type="qwen2")
    assert resolve_architecture(config) == "Qwen2ForCausalLM"
    assert (
        resolve_architecture(SimpleNamespace(architectures=None, model_type="mistral"))
        == "MistralForCausalLM"
    )
    with pytest.raises(ValueError) as info:
        resolve_architecture(SimpleNamespace(architectures=["GPT2LMHeadModel"], model_type="gpt2"))
    assert "'GPT2LMHeadModel'" in str(info.value)
    assert all(name in str(info.value) for name in supported_architectures())
    with pytest.raises(ValueError, match="model_type gpt2"):
        resolve_architecture(SimpleNamespace(architectures=[], model_type="gpt2"))


def test_every_entry_names_a_causal_lm_and_aliases_share_their_class():
    for name in supported_architectures():
        assert issubclass(model_class(name), CausalLM), name
    assert model_class("MistralForCausalLM") is model_class("LlamaForCausalLM")
    assert model_class("Qwen2ForCausalLM") is model_class("LlamaForCausalLM")
    types = [t for entry in MODELS.values() for t in entry.model_types]
    assert len(types) == len(set(types)), "a model_type names one architecture"


def test_the_planner_reads_the_traits_without_torch():
    code = "import sys, backend.planner.memory_plan, backend.engine.models.registry\n"
    code += "assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    assert not traits_of("Gemma3ForCausalLM", "gemma3_text").captured_decode
    assert not traits_of("SomethingElse", "olmo2").captured_decode  # by model_type when the name is unknown
    assert traits_of("SomethingElse", "qwen3").captured_decode
    assert traits_of("GPT2LMHeadModel", "gpt2") is None


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_declared_traits_are_what_the_built_model_does(arch):
    loaded = load_model(tiny_model(arch)[0], torch.float32, torch.device("cpu"))
    traits = traits_of(loaded.hf_config.architectures[0], loaded.hf_config.model_type)
    assert traits is not None and type(loaded.model) is model_class(loaded.hf_config.architectures[0])
    specs = loaded.model.attention_specs
    reasons = [unsupported_layer(layer) for layer in loaded.model.layers]
    assert (reasons == [None] * len(reasons)) == traits.captured_decode, reasons
    assert all(spec.rope is not None for spec in specs) == traits.rope_on_every_layer


def edited_copy(tmp_path, **changes) -> str:
    """The tiny Llama folder with config.json's fields changed."""
    folder = tmp_path / "edited"
    shutil.copytree(tiny_model("llama")[0], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))
    return str(folder)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"num_hidden_layers": 0},
            r"num_hidden_layers = 0 is outside what any model has: expected a whole number in 1..1,024",
        ),
        ({"vocab_size": 1 << 40}, r"vocab_size = 1099511627776 is outside what any model has"),
        ({"hidden_size": -64}, r"hidden_size = -64 is outside what any model has"),
        ({"num_key_value_heads": 3}, r"must be a multiple of num_key_value_heads \(3\)"),
        (
            {"max_position_embeddings": 1 << 30},
            r"max_position_embeddings = 1073741824 is outside what any model",
        ),
        ({"rms_norm_eps": -1.0}, r"rms_norm_eps must be a positive finite number"),
        (
            {"intermediate_size": 4096},
            r"mlp\.\w+_proj\.weight' has shape .*: the config does not describe these weights",
        ),
        ({"num_hidden_layers": 500}, r"weights missing from the checkpoint: \['layers.10"),
    ],
)
def test_a_config_that_does_not_fit_fails_before_allocating(tmp_path, monkeypatch, changes, message):
    def no_allocation(*args, **kwargs):
        raise AssertionError("the model was allocated")

    monkeypatch.setattr(torch.nn.Module, "to_empty", no_allocation)
    with pytest.raises(ValueError, match=message):
        LLM(edited_copy(tmp_path, **changes), dtype="float32", device="cpu")


def test_partial_rotary_matches_transformers():
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(0)
    tokens, heads, head_dim, rotary_dim = 7, 3, 16, 8
    x = torch.randn(tokens, heads, head_dim, generator=gen)
    angles = torch.rand(tokens, rotary_dim // 2, generator=gen) * 10
    emb = torch.cat((angles, angles), dim=-1)
    rope = RopeTables(emb.cos(), emb.sin()).at(torch.arange(tokens))
    ours = apply_rope(x, rope.cos, rope.sin)
    q = x.transpose(0, 1)[None]  # transformers' [batch, heads, tokens, head_dim]
    theirs, _ = apply_rotary_pos_emb(q, q, emb.cos()[None], emb.sin()[None])
    assert torch.equal(ours, theirs[0].transpose(0, 1))
    assert torch.equal(ours[..., rotary_dim:], x[..., rotary_dim:])


def test_rope_tables_per_layer_type_match_transformers():
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    parameters = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
    }
    sizes = dict(hidden_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2)
    config = Gemma3TextConfig(**sizes, num_hidden_layers=6, rope_parameters=parameters)
    positions = torch.arange(40)
    for layer_type in parameters:
        cos, sin = Gemma3RotaryEmbedding(config)(
            torch.zeros(1, 40, 64), positions[None], layer_type=layer_type
        )
        table = rope_table(config, RopeSpec(16, layer_type), 40)
        assert torch.equal(table.cos, cos[0]) and torch.equal(table.sin, sin[0]), layer_type
    local, full = (rope_table(config, RopeSpec(16, name), 40) for name in parameters)
    assert not torch.equal(local.cos, full.cos)


def one_prefill(tokens: int, block_size: int, use_kernel: bool) -> AttentionMetadata:
    """One sequence's first chunk of tokens in blocks 0, 1, ...: the kernels' inputs, or the PyTorch
    path's chunk (plain causal over its own keys, as the runner builds a first chunk)."""
    positions = torch.arange(tokens)
    kernel = PrefillKernelInputs(
        torch.tensor([0, tokens]), torch.tensor([tokens]), torch.arange(-(-tokens // block_size))[None]
    )
    chunks = [] if use_kernel else [PrefillChunk(0, tokens, 0, None, None)]
    return AttentionMetadata(
        positions, positions, 0, None, None, None, None, chunks, kernel if use_kernel else None, None
    )


@pytest.mark.parametrize("use_kernel", [False, True])
@pytest.mark.parametrize("rope", [RopeSpec(16), RopeSpec(8), None], ids=["whole", "partial", "none"])
@pytest.mark.parametrize("qk_norm", [(False, False), (True, False), (True, True)], ids=["", "qk", "qk-all"])
def test_attention_options_reach_paged_attention_as_transformers_computes_them(use_kernel, rope, qk_norm):
    """A layer with a window, a soft-cap and sinks (each now accepted) computes transformers' attention
    with all three (tests/attention_utils.reference_attention), on the kernels and on the PyTorch path,
    with whole-head, partial or no RoPE (the kernel path rotates on rope_and_cache for all three), without
    or with q/k norm, per head or across heads (on the kernels: qk_norm in place before rope_and_cache)."""
    spec = AttentionSpec(4, 2, 16, 0.3, rope, *qk_norm, sliding_window=5, logits_soft_cap=4.0, has_sinks=True)
    torch.manual_seed(0)
    attention = Attention(64, spec, (False, False), 1e-6)
    assert attention.options == {"sliding_window": 5, "soft_cap": 4.0, "sinks": True}
    with torch.no_grad():
        for linear in (attention.qkv_proj, attention.o_proj):
            linear.weight.normal_(0.0, 0.5)
        for norm in (attention.q_norm, attention.k_norm):
            if norm is not None:
                norm.weight.normal_(1.0, 0.5)
        attention.sinks.copy_(torch.tensor([-1.0, 0.0, 1.0, 3.0]))
    attention.prepare()
    attention.use_kernel = use_kernel
    tokens, block_size = 21, 16
    x = torch.randn(tokens, 64)
    tables = rope_table(SimpleNamespace(rope_parameters={}), rope, tokens) if rope else None
    ropes = {rope: tables.at(torch.arange(tokens))} if rope and tables else {}
    pool = (2, 2, block_size, 16)
    caches = (torch.zeros(pool), torch.zeros(pool))
    meta = one_prefill(tokens, block_size, use_kernel)
    with torch.inference_mode():
        out = attention(x, ropes, *caches, meta)
        q, k, v = attention.qkv_heads(attention.qkv_proj(x), ropes.get(rope))  # q/k rotated as transformers
        features = Features(sliding_window=5, soft_cap=4.0, sinks=attention.sinks.detach())
        o = reference_attention(q, k.transpose(0, 1), v.transpose(0, 1), list(range(tokens)), 0.3, features)
        expected = attention.o_proj(o.float().reshape(tokens, 64))
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
    plain = reference_attention(q, k.transpose(0, 1), v.transpose(0, 1), list(range(tokens)), 0.3, Features())
    assert not torch.allclose(o, plain, atol=1e-2)  # the options changed what the layer computes


@pytest.mark.parametrize(
    ("feature", "name"),
    [
        ({"sliding_window": 128}, "sliding_window"),
        ({"logits_soft_cap": 50.0}, "soft_cap"),
        ({"has_sinks": True}, "sinks"),
    ],
)
def test_an_option_the_path_does_not_take_is_refused_by_name(feature, name, monkeypatch):
    """Every AttentionSpec feature is in PAGED_ATTENTION_OPTIONS now; one that a path stops taking (or a
    future one not yet added) is refused when the layer is built, naming it, not run without it."""
    spec = AttentionSpec(4, 2, 16, 0.25, RopeSpec(16), **feature)
    assert set(Attention(64, spec, (False, False), 1e-6).options) == {name}
    monkeypatch.setattr(attention_layer, "PAGED_ATTENTION_OPTIONS", PAGED_ATTENTION_OPTIONS - {name})
    with pytest.raises(ValueError, match=f"attention feature.*{name}"):
        Attention(64, spec, (False, False), 1e-6)
    Attention(64, AttentionSpec(4, 2, 16, 0.25, None), (False, False), 1e-6)  # no RoPE: nothing refused


@pytest.mark.parametrize("across_heads", [False, True])
def test_the_captured_step_takes_qk_norm_and_every_option(across_heads):
    """The captured decode step takes every option, RoPE variant and q/k norm (Qwen3's per head, OLMoE's
    across heads); a layer kind it has no calls for is refused by name."""
    spec = AttentionSpec(4, 2, 16, 0.25, None, True, across_heads, sliding_window=8, has_sinks=True)
    layer = DecoderLayer(Attention(64, spec, (False, False), 1e-6), GatedMLP(64, 128, False), 64, 1e-6)
    assert unsupported_layer(layer) is None
    sandwich = SandwichDecoderLayer(
        Attention(64, spec, (False, False), 1e-6), GatedMLP(64, 128, False), 64, 1e-6, True
    )
    assert unsupported_layer(sandwich) == "a layer of type SandwichDecoderLayer has no captured calls"


@pytest.mark.parametrize("flags", [[1, 1, 0], [1, 1, 1, 2], "1110", None])
def test_smollm3_no_rope_layers_must_be_one_flag_per_layer(flags):
    from backend.engine.models.smollm3 import layer_flags

    assert layer_flags(SimpleNamespace(no_rope_layers=[1, 1, 1, 0]), "no_rope_layers", 4) == [True] * 3 + [
        False
    ]
    with pytest.raises(ValueError, match=r"no_rope_layers must be a list of 4 values 0 or 1, got"):
        layer_flags(SimpleNamespace(no_rope_layers=flags), "no_rope_layers", 4)
