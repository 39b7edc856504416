"""What the captured decode step (decode_graph.py) serves: a model whose every layer is a pre-norm
DecoderLayer with a SiLU or GELU(tanh) GatedMLP or a FusedMoE, q/k norm (per head or across heads) on the
qk_norm kernel, RoPE (whole-head, partial or none) on the rope_and_cache kernel, attention with any window,
soft-cap and sinks (PAGED_ATTENTION_OPTIONS) and no factor left unfolded, each projection on a kernel the
graph calls (graph_ops.unsupported_linear).
`unsupported_reason` says why a model is not captured (the engine logs it once); `graph_shape` gives the
widths that size a graph's buffers (decode_graph_memory). A family whose layers the graph should learn
adds their ops in decode_graph.py and removes their refusal here.
"""

from __future__ import annotations

import ctypes

from backend.engine import cpu_kernels
from backend.engine.decode_graph_memory import DecodeGraphShape
from backend.engine.graph_ops import ACTIVATION_OPS, Op, unsupported_linear
from backend.engine.layers.decoder import DecoderLayer
from backend.engine.layers.fused_moe import FusedMoE
from backend.engine.layers.fused_moe.graph import unsupported_moe
from backend.engine.layers.mlp import GatedMLP
from backend.engine.models.base import CausalLM


def decoder_layers(model: CausalLM) -> list[DecoderLayer]:
    """The model's layers, every one a DecoderLayer with a GatedMLP or a FusedMoE (unsupported_reason
    checked that)."""
    layers = [layer for layer in model.layers if isinstance(layer, DecoderLayer)]
    assert len(layers) == len(model.layers)
    return layers


def unsupported_reason(model: CausalLM, uses_decode_kernel: bool) -> str | None:
    """Why this model's decode steps cannot be captured (None: they can)."""
    if not uses_decode_kernel or cpu_kernels.step_graph_op_size() != ctypes.sizeof(Op):
        return "the native CPU kernels do not serve this device and dtype"
    reason = next(filter(None, (unsupported_layer(layer) for layer in model.layers)), None)
    if reason is not None:
        return reason
    layers = decoder_layers(model)
    if not (layers[0].self_attn.use_kernel and layers[0].input_layernorm.use_kernel):
        return "RoPE, the cache write or the norms are not on the native kernels"
    if model.lm_head is None:
        return "a tied lm_head that is not prepared"
    dtype = model.norm.weight.dtype
    blocks = [layer.mlp for layer in layers if isinstance(layer.mlp, FusedMoE)]
    reason = next(filter(None, (unsupported_moe(block, dtype) for block in blocks)), None)
    if reason is not None:
        return reason
    return next((r for r in (unsupported_linear(p, dtype) for p in projections(model)) if r), None)


def unsupported_layer(layer: object) -> str | None:
    """Why a layer has no captured calls (None: it has): the captured step is a pre-norm DecoderLayer with
    a GatedMLP whose activation has a kernel or a FusedMoE, and attention with the options paged_attention
    takes (windows, soft-caps, sinks); q/k norm and every RoPE variant have their kernels."""
    if not isinstance(layer, DecoderLayer):
        return f"a layer of type {type(layer).__name__} has no captured calls"
    if not isinstance(layer.mlp, GatedMLP | FusedMoE):
        return f"an MLP of type {type(layer.mlp).__name__} has no captured calls"
    attention = layer.self_attn
    if isinstance(layer.mlp, GatedMLP) and layer.mlp.hidden_act not in ACTIVATION_OPS:
        return f"the {layer.mlp.hidden_act} MLP activation has no captured kernel"
    # a FusedMoE's output_scale is the native call's (csrc/moe.cpp MoeLayer.scale)
    if attention.output_scale != 1.0 or (isinstance(layer.mlp, GatedMLP) and layer.mlp.output_scale != 1.0):
        return "a residual multiplier on quantized projections has no captured kernel"
    return None


def projections(model: CausalLM) -> list:
    """Every projection a decode step multiplies through, the lm_head last."""
    found = []
    for layer in decoder_layers(model):
        found += [layer.self_attn.qkv_proj, layer.self_attn.o_proj]
        mlp = layer.mlp
        if isinstance(mlp, FusedMoE):  # the router and the shared expert's (the experts are the MoE call's)
            shared = [] if mlp.shared_expert is None else [mlp.shared_expert]
            found += [mlp.gate, *(p for p in [mlp.shared_expert_gate] if p is not None)]
            found += [p for m in shared for p in (m.gate_up_proj, m.down_proj)]
            continue
        assert isinstance(mlp, GatedMLP)
        found += [mlp.gate_up_proj, mlp.down_proj]
    return [*found, model.lm_head]


def graph_shape(model: CausalLM) -> DecodeGraphShape:
    """The widths that size a graph of this model's buffers (decode_graph_memory)."""
    args = model.args
    return DecodeGraphShape(
        args.hidden_size,
        args.intermediate_size,
        args.num_heads,
        args.num_kv_heads,
        args.head_dim,
        args.vocab_size,
        model.norm.weight.element_size(),
    )
