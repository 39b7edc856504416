"""The MoE block (backend/engine/layers/fused_moe/) against transformers 5.24's own blocks, fp32, random
weights, one tiny config per family: loaded from the checkpoint save_pretrained writes (the Hub's per-expert
names, Granite's stacked ones), our block picks the experts transformers' router picks, in its order, and
its output equals transformers' within fp32 summation error at 1, 7 and 64 tokens (one token leaves most
experts without tokens). transformers' in-memory (fused) names load the same parameters; gpt-oss's MXFP4
blocks, and GGUF's expert tensors, load as stored and compute what their dequantization computes. Planted
bugs (gate and up swapped, renormalisation flipped, an expert's weights shifted) fail the comparison."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from backend.engine.layers.fused_moe import FusedMoE, MoEConfig, load_moe_weight, moe_config, moe_weight
from backend.engine.layers.fused_moe.checkpoint import gguf_experts
from backend.engine.layers.fused_moe.routing import select_experts
from backend.engine.quantization.gguf_blocks import dequantize
from backend.engine.quantization.gguf_reader import QuantizedWeight
from tests.gguf_utils import Q, random_blocks
from tests.moe_utils import (
    EXPERTS,
    FAMILIES,
    HIDDEN,
    hf_block,
    hf_model,
    hf_router_indices,
    load_block,
    saved_state,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
RTOL = 1e-5  # fp32 summation error over sums of 32-64 terms, relative to the output's scale


def close(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    return bool((ours - theirs).abs().max() <= RTOL * theirs.abs().max())


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    model = hf_model(request.param)
    return request.param, model, load_block(model, saved_state(model))


@pytest.mark.parametrize("tokens", [1, 7, 64])
def test_block_equals_transformers(family, tokens):
    name, model, block = family
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        _, ids = select_experts(block.gate(x), block.config)
        ours = block(x)
    assert torch.equal(ids, hf_router_indices(model, x)), name
    if tokens == 1:
        assert ids.unique().numel() < EXPERTS  # experts without tokens
    assert close(ours, hf_block(model, x)), (name, (ours - hf_block(model, x)).abs().max())


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "granitemoe", "gpt_oss"])
def test_transformers_fused_names_load_the_same(name):
    """model.state_dict()'s names (experts.gate_up_proj [E, 2I, H]; gpt-oss's [E, H, 2I] alternating)."""
    model = hf_model(name)
    from_hub, from_memory = load_block(model, saved_state(model)), load_block(model, model.state_dict())
    assert any("experts.gate_up_proj" in key for key in model.state_dict())
    for (key, ours), (_, theirs) in zip(
        from_hub.state_dict().items(), from_memory.state_dict().items(), strict=True
    ):
        assert torch.equal(ours, theirs), key


def test_gpt_oss_mxfp4_checkpoint_as_stored():
    """gpt-oss's *_blocks / *_scales: kept as MXFP4 blocks; the block computes what transformers computes
    with the weights its loader dequantizes (convert_moe_packed_tensors, fp32)."""
    model = hf_model("gpt_oss")
    state = saved_state(model)
    experts = model.model.layers[0].mlp.experts
    generator = torch.Generator().manual_seed(0)
    for projection, (rows, cols) in {"gate_up_proj": (2 * 32, HIDDEN), "down_proj": (HIDDEN, 32)}.items():
        blocks = torch.randint(
            0, 256, (EXPERTS, rows, cols // 32, 16), generator=generator, dtype=torch.uint8
        )
        scales = torch.randint(121, 126, (EXPERTS, rows, cols // 32), generator=generator, dtype=torch.uint8)
        del state[f"model.layers.0.mlp.experts.{projection}"]
        state[f"model.layers.0.mlp.experts.{projection}_blocks"] = blocks
        state[f"model.layers.0.mlp.experts.{projection}_scales"] = scales
        with torch.no_grad():  # transformers' [E, k, n] parameter from the same blocks
            getattr(experts, projection).copy_(
                convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            )
    block = load_block(model, state)
    assert block.quantized["w13"].qtype == block.quantized["w2"].qtype == "mxfp4"
    x = torch.randn(7, HIDDEN, generator=generator)
    with torch.no_grad():
        assert close(block(x), hf_block(model, x))


@pytest.mark.parametrize("types", [("q4_0", "q4_0", "q6_k"), ("q4_0", "q8_0", "q4_k")])
def test_gguf_experts_kept_as_stored(types):
    """ffn_gate_exps / ffn_up_exps / ffn_down_exps as gguf_reader hands them (experts stacked on rows): gate
    and up of one type joined into w13's blocks, of two types decoded into the dense weights; either way the
    block computes what the decoded weights compute, bit for bit (the PyTorch path decodes exactly)."""
    config = MoEConfig(4, 2, 256, 256, "softmax_topk", renormalize=True)
    rng = np.random.default_rng(0)
    parts = [
        QuantizedWeight(
            qtype, torch.from_numpy(random_blocks(Q[qtype.upper()], 4 * rows, 256, rng)), (4 * rows, 256)
        )
        for qtype, rows in zip(types, (256, 256, 256), strict=True)
    ]
    block, dense = FusedMoE(config), FusedMoE(config)
    torch.nn.init.normal_(block.gate.weight)
    dense.gate.weight.data.copy_(block.gate.weight)
    gguf_experts(block, *parts)
    assert ("w13" in block.quantized) == (types[0] == types[1]) and block.quantized["w2"].qtype == types[2]
    with torch.no_grad():
        decoded = [dequantize(p.data, p.qtype).view(4, 256, 256) for p in parts]
        dense.w13_weight.copy_(torch.cat(decoded[:2], 1))
        dense.w2_weight.copy_(decoded[2])
        x = torch.randn(9, 256)
        assert torch.equal(block(x), dense(x))


def test_checkpoint_names():
    expected = {
        "block_sparse_moe.experts.3.w1.weight": ("w13", 3, "gate"),
        "block_sparse_moe.experts.3.w3.weight": ("w13", 3, "up"),
        "mlp.experts.12.down_proj.weight": ("w2", 12, "all"),
        "block_sparse_moe.input_linear.weight": ("w13", None, "all"),
        "block_sparse_moe.router.layer.weight": ("router", None, "all"),
        "mlp.router.bias": ("router_bias", None, "all"),
        "mlp.experts.gate_up_proj_scales": ("w13_scales", None, "all"),
        "mlp.shared_expert_gate.weight": ("shared_gate", None, "all"),
        "shared_mlp.output_linear.weight": ("shared_down", None, "all"),
    }
    for name, (target, expert, shard) in expected.items():
        weight = moe_weight(name)
        assert weight is not None and (weight.target, weight.expert, weight.shard) == (target, expert, shard)
    for name in ("mlp.gate_proj.weight", "self_attn.q_proj.weight", "input_layernorm.weight"):
        assert moe_weight(name) is None  # a dense MLP's or attention's: the model's own


def test_bad_shapes_and_configs_say_what_is_allowed():
    model = hf_model("mixtral")
    block = FusedMoE(moe_config(model.config))
    weight = moe_weight("block_sparse_moe.experts.0.w1.weight")
    assert weight is not None
    with pytest.raises(ValueError, match="expected shape"):
        load_moe_weight(block, weight, torch.zeros(3, 3))
    with pytest.raises(ValueError, match="top_k"):
        MoEConfig(num_experts=4, top_k=5, hidden_size=8, intermediate_size=8)
    model.config.model_type = "llama"
    with pytest.raises(ValueError, match="no MoE block for model_type 'llama'"):
        moe_config(model.config)


@pytest.mark.parametrize("bug", ["gate_up_swapped", "renormalize_flipped", "expert_shifted"])
def test_planted_bugs_fail_the_comparison(bug):
    """gate_up_swapped: the loader putting w3 (up) where w1 (gate) goes; renormalize_flipped: OLMoE's
    norm_topk_prob read the wrong way round; expert_shifted: expert e's weights loaded into e + 1."""
    family = "olmoe" if bug == "renormalize_flipped" else "mixtral"
    model = hf_model(family)
    block = load_block(model, saved_state(model))
    inter = block.config.intermediate_size
    with torch.no_grad():
        if bug == "gate_up_swapped":
            block.w13_weight.copy_(torch.cat((block.w13_weight[:, inter:], block.w13_weight[:, :inter]), 1))
        elif bug == "expert_shifted":
            block.w13_weight.copy_(block.w13_weight.roll(1, dims=0))
        else:
            block.config = dataclasses.replace(block.config, renormalize=not block.config.renormalize)
    x = torch.randn(7, HIDDEN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert not close(block(x), hf_block(model, x))
