"""What the captured decode step (decode_graph.py) serves: a model whose every layer is a pre-norm
DecoderLayer with a SiLU GatedMLP, whole-head RoPE on the rope_and_cache kernel, plain causal attention
and no factor left unfolded, each projection on a kernel the graph calls (graph_ops.unsupported_linear).
`unsupported_reason` says why a model is not captured (the engine logs it once); `graph_shape` gives the
widths that size a graph's buffers (decode_graph_memory). A family whose layers the graph should learn
adds their ops in decode_graph.py and removes their refusal here.
"""

from __future__ import annotations

import ctypes

from backend.engine import cpu_kernels
from backend.engine.decode_graph_memory import DecodeGraphShape
from backend.engine.graph_ops import Op, unsupported_linear
from backend.engine.layers.decoder import DecoderLayer
from backend.engine.layers.mlp import GatedMLP
from backend.engine.models.base import CausalLM


def decoder_layers(model: CausalLM) -> list[DecoderLayer]:
    """The model's layers, every one a DecoderLayer with a GatedMLP (unsupported_reason checked that)."""
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
    return next((r for r in (unsupported_linear(p, dtype) for p in projections(model)) if r), None)


def unsupported_layer(layer: object) -> str | None:
    """Why a layer has no captured calls (None: it has): the captured step is a pre-norm DecoderLayer with
    a SiLU GatedMLP, whole-head RoPE on the rope_and_cache kernel and plain causal attention."""
    if not isinstance(layer, DecoderLayer):
        return f"a layer of type {type(layer).__name__} has no captured calls"
    if not isinstance(layer.mlp, GatedMLP):
        return f"an MLP of type {type(layer.mlp).__name__} has no captured calls"
    attention, spec = layer.self_attn, layer.self_attn.spec
    if spec.qk_norm:
        return "q/k norm (Qwen3) has no captured kernel"
    if not spec.rope_kernel_serves:
        return "a layer without RoPE or with partial rotary has no captured kernel"
    if attention.options or attention.sinks is not None:
        return f"attention options {sorted(attention.options)} have no captured kernel"
    if layer.mlp.hidden_act != "silu":
        return f"the {layer.mlp.hidden_act} MLP activation has no captured kernel"
    if attention.output_scale != 1.0 or layer.mlp.output_scale != 1.0:
        return "a residual multiplier on quantized projections has no captured kernel"
    return None


def projections(model: CausalLM) -> list:
    """Every projection a decode step multiplies through, the lm_head last."""
    found = []
    for layer in decoder_layers(model):
        found += [layer.self_attn.qkv_proj, layer.self_attn.o_proj]
        assert isinstance(layer.mlp, GatedMLP)
        found += [layer.mlp.gate_up_proj, layer.mlp.down_proj]
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
