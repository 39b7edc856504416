"""The captured decode step's buffers counted before they exist (decode_graph.py allocates them): what the
engine's default KV budget gives up to them, and the planner's figure for the embedded engine.

DecodeGraph.buffer_bytes sums the tensors the graph allocated; tests/test_decode_graph_memory.py holds
this count to that sum. No torch here: the planner imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

INT64_BYTES = 8  # token ids, positions, slots, context lengths and block tables
LOGITS_BYTES = 4  # a captured lm_head writes fp32 logits (llama.Linear / QuantizedLinear float_output)
STEP_INTS = 4  # rows of step_ints: token ids, positions, slots, context lengths
HIDDEN_BUFFERS = 5  # hidden (the embeddings), two residual streams, normed, out


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


def decode_graph_bytes(
    shape: DecodeGraphShape, max_num_seqs: int, max_model_len: int, block_size: int
) -> int:
    """Bytes of DecodeGraph's buffers for max_num_seqs rows: step_ints [4, S] and block_tables
    [S, ceil(max_model_len / block_size)] int64; hidden, residuals, normed and out [S, hidden]; qkv
    [S, q + 2 kv]; attention_out [S, q]; gate_up [S, 2 intermediate]; activation [S, intermediate] in the
    model's dtype; logits [S, vocab] fp32."""
    max_blocks = -(-max_model_len // block_size)
    q_size, kv_size = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    width = HIDDEN_BUFFERS * shape.hidden_size + 2 * q_size + 2 * kv_size + 3 * shape.intermediate_size
    per_row = (STEP_INTS + max_blocks) * INT64_BYTES + width * shape.element_bytes
    return max_num_seqs * (per_row + shape.vocab_size * LOGITS_BYTES)
