"""The captured decode step's buffers counted before they exist (decode_graph.py allocates them): what the
engine's default KV budget gives up to them, and the planner's figure for the embedded engine.

DecodeGraph.buffer_bytes sums the tensors the graph allocated; tests/engine/test_decode_graph_memory.py holds
this count to that sum. No torch here: the planner imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

INT64_BYTES = 8  # token ids, positions, slots, context lengths and block tables
LOGITS_BYTES = 4  # a captured lm_head writes fp32 logits (llama.Linear / QuantizedLinear float_output)
STEP_INTS = 4  # rows of step_ints: token ids, positions, slots, context lengths


@dataclass(slots=True, frozen=True)
class DecodeGraphShape:
    """The model's widths that size the graph's buffers (vLLM's names)."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    element_bytes: int  # the model's dtype: 2 for bf16 / fp16, 4 for fp32


def activation_widths(shape: DecodeGraphShape) -> dict[str, int]:
    """The widths of the graph's [S, width] buffers in the model's dtype, by DecodeGraph's names: hidden
    (the embeddings: layer 0's residual), the two residual streams, normed, out, qkv, attention_out, gate_up
    and activation. DecodeGraph allocates these; decode_graph_bytes counts them."""
    hidden, intermediate = shape.hidden_size, shape.intermediate_size
    q_size, kv_size = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return {
        "hidden": hidden,
        "residual_0": hidden,
        "residual_1": hidden,
        "normed": hidden,
        "out": hidden,
        "qkv": q_size + 2 * kv_size,
        "attention_out": q_size,
        "gate_up": 2 * intermediate,
        "activation": intermediate,
    }


def decode_graph_bytes(
    shape: DecodeGraphShape, max_num_seqs: int, max_model_len: int, block_size: int
) -> int:
    """Bytes of DecodeGraph's buffers for max_num_seqs rows: step_ints [4, S] and block_tables
    [S, ceil(max_model_len / block_size)] int64, activation_widths' buffers in the model's dtype, logits
    [S, vocab] fp32."""
    max_blocks = -(-max_model_len // block_size)
    width = sum(activation_widths(shape).values())
    per_row = (STEP_INTS + max_blocks) * INT64_BYTES + width * shape.element_bytes
    return max_num_seqs * (per_row + shape.vocab_size * LOGITS_BYTES)
