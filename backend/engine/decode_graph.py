"""DecodeGraph: a decode-only step on the CPU captured once as a flat list of native kernel calls, then
replayed every such step in one call (csrc/step_graph.cpp): vLLM's CUDA graphs, where what is saved is
not kernel launches but the Python around each call (module calls, argument conversion, new tensors).

Every call reads and writes persistent buffers sized for max_num_seqs rows: the step's token ids,
positions, slots and context lengths ([4, S] int64), block tables [S, max_blocks] (max_model_len wide, so
a row's stride never changes), hidden states, two residual streams (the fused add + norm may not write
its input), q/k/v, attention output, gate/up, the MLP activation and the logits. A step with M rows
copies its inputs into the first M rows, then runs the calls with M as their row count (the first one
embeds the tokens: a dense table's rows or an interleaved Q8_0 one's, else a torch call embeds them before);
rows past M are never read. The calls are those of the eager modules with the same
arguments (the decode kernel reads a row's first ceil(len / block_size) table entries whatever the
tables' width), so the logits are the eager path's bit for bit (tests/engine/test_decode_graph.py).

A step is captured-path only when every row is one plain decode that samples (no prefill chunk, no
draft tokens) and its rows fit the kernels (GGUF blocks kept row by row, the K-types: quant_gemv's 8
rows, Q6_K's quant_gemm's 64, past which the eager module takes other kernels); any other step takes the
modules.
`decode_graph_support.unsupported_reason` says why a model cannot be captured at all (logged once at start).
"""

from __future__ import annotations

import array
import ctypes
from dataclasses import dataclass

import torch

from backend.engine import cpu_kernels
from backend.engine.decode_graph_memory import STEP_INTS, activation_widths
from backend.engine.decode_graph_support import decoder_layers, graph_shape, projections
from backend.engine.graph_ops import (
    ACTIVATION_OPS,
    Op,
    add_rms_norm_op,
    decode_attention_op,
    embedding_op,
    linear_ops,
    qk_norm_op,
    rms_norm_op,
    rope_and_cache_op,
    row_limit,
)
from backend.engine.layers.attention import Attention
from backend.engine.layers.decoder import DecoderLayer
from backend.engine.layers.fused_moe import FusedMoE
from backend.engine.layers.fused_moe.graph import moe_buffers, moe_ops
from backend.engine.layers.mlp import GatedMLP
from backend.engine.layers.norm import RMSNorm
from backend.engine.models.base import CausalLM
from backend.engine.scheduler import ScheduledSeq


@dataclass(slots=True)
class StepRows:
    """A decode-only step as the graph reads it, rows in the scheduler's order."""

    ints: array.array  # token ids, then positions, then slots, then context lengths: 4 M int64
    tables: array.array  # M rows of max(blocks) entries, padded with block 0
    num_blocks: int  # max(blocks): the tables' width this step


class DecodeGraph:
    def __init__(
        self,
        model: CausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
    ) -> None:
        self.model, self.block_size = model, block_size
        self.max_num_seqs = size = max_num_seqs
        limits = [limit for limit in map(row_limit, projections(model)) if limit is not None]
        self.max_rows = min([max_num_seqs, *limits])  # a step with more rows runs the modules
        self.max_blocks = -(-max_model_len // block_size)
        dtype, device = model.norm.weight.dtype, model.norm.weight.device

        def buffer(width: int, buffer_dtype: torch.dtype = dtype) -> torch.Tensor:
            return torch.zeros(size, width, dtype=buffer_dtype, device=device)

        self.step_ints = torch.zeros(STEP_INTS, size, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(size, self.max_blocks, dtype=torch.int64, device=device)
        b = {name: buffer(width) for name, width in activation_widths(graph_shape(model)).items()}
        self.hidden, self.residuals = b["hidden"], (b["residual_0"], b["residual_1"])
        self.normed, self.out, self.qkv = b["normed"], b["out"], b["qkv"]
        self.attention_out, self.gate_up, self.activation = b["attention_out"], b["gate_up"], b["activation"]
        # fp32 logits, as the eager step's .float() gives them: gemm_bf16 and interleaved lm_heads write them
        # (float_out), a row-layout one writes bf16 that the next call widens in place (graph_ops)
        self.logits = buffer(model.args.vocab_size, torch.float32)
        blocks = [m for m in model.modules() if isinstance(m, FusedMoE)]  # one set of buffers serves all
        self.moe_buffers = moe_buffers(blocks, size, dtype, device) if blocks else None
        ops = self.capture(kv_caches)
        self.ops = (Op * len(ops))(*ops)

    def capture(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[Op]:
        """The step's calls in order: the embedding (where a kernel does it), then per layer its norms,
        projections, q/k norm, RoPE + cache write and attention."""
        model = self.model
        embedding = None  # the embedding's scale (embedding_scale) has no captured call: the torch call does
        if model.embedding_scale == 1.0:
            embedding = embedding_op(model.embed_tokens, self.step_ints[0], self.hidden)
        self.embeds_in_graph = embedding is not None
        ops: list[Op] = [embedding] if embedding is not None else []
        residual = self.hidden
        for i, (layer, kv_cache) in enumerate(zip(decoder_layers(model), kv_caches, strict=True)):
            norm = layer.input_layernorm
            if i == 0:
                ops.append(rms_norm_op(self.hidden, norm.weight, norm.eps, self.normed))
            else:
                residual = self.add_norm(residual, norm, ops)
            ops += self.attention_ops(layer, kv_cache)
            residual = self.add_norm(residual, layer.post_attention_layernorm, ops)
            ops += self.mlp_ops(layer)
        self.add_norm(residual, model.norm, ops)  # the eager path's norm(x + residual) of the last layer
        assert model.lm_head is not None
        return ops + linear_ops(model.lm_head, self.normed, self.logits)

    def add_norm(self, residual: torch.Tensor, norm: RMSNorm, ops: list[Op]) -> torch.Tensor:
        """Appends normed = norm(out + residual); returns the residual stream it wrote (the other buffer)."""
        stream = self.residuals[1] if residual is self.residuals[0] else self.residuals[0]
        ops.append(add_rms_norm_op(self.out, residual, norm.weight, norm.eps, self.normed, stream))
        return stream

    def attention_ops(self, layer: DecoderLayer, kv_cache: tuple[torch.Tensor, torch.Tensor]) -> list[Op]:
        attention: Attention = layer.self_attn
        spec = attention.spec
        positions, slots, context_lens = self.step_ints[1], self.step_ints[2], self.step_ints[3]
        table = None if spec.rope is None else self.model.rope_tables[spec.rope]
        rope = None if table is None else (table.cos, table.sin)
        assert attention.sinks is None or attention.kernel_sinks is not None, "set by prepare_weights"
        q_norm, k_norm = attention.q_norm, attention.k_norm
        qk_norm = [] if q_norm is None or k_norm is None else [qk_norm_op(self.qkv, q_norm, k_norm, spec)]
        return [
            *linear_ops(attention.qkv_proj, self.normed, self.qkv),
            *qk_norm,
            rope_and_cache_op(
                self.qkv,
                positions,
                slots,
                rope,
                kv_cache,
                attention.num_heads,
                attention.kv_scales,
                spec.rotary_dim,
            ),
            decode_attention_op(
                self.qkv,
                kv_cache,
                self.block_tables,
                context_lens,
                self.attention_out,
                attention.scale,
                attention.kv_scales,
                sliding_window=spec.sliding_window,
                soft_cap=spec.logits_soft_cap,
                sinks=attention.kernel_sinks,  # the module keeps it alive as long as the graph
            ),
            *linear_ops(attention.o_proj, self.attention_out, self.out),
        ]

    def mlp_ops(self, layer: DecoderLayer) -> list[Op]:
        mlp = layer.mlp
        if isinstance(mlp, FusedMoE):  # router, shared expert, then routing, experts and combine in one call
            assert self.moe_buffers is not None
            return moe_ops(mlp, self.normed, self.out, self.moe_buffers)
        assert isinstance(mlp, GatedMLP)
        if mlp.fused_silu_and_mul:
            ops = linear_ops(mlp.gate_up_proj, self.normed, self.activation)
        else:
            ops = linear_ops(mlp.gate_up_proj, self.normed, self.gate_up)
            ops.append(ACTIVATION_OPS[mlp.hidden_act](self.gate_up, self.activation))
        return ops + linear_ops(mlp.down_proj, self.activation, self.out)

    def step_rows(self, decodes: list[ScheduledSeq]) -> StepRows | None:
        """The step's inputs, or None when it is not for the graph (a row that is not a plain decode that
        samples, more rows than its kernels take, a table wider than max_model_len's)."""
        if len(decodes) > self.max_rows:
            return None
        bs = self.block_size
        ids, positions, slots = array.array("q"), array.array("q"), array.array("q")
        tables: list[list[int]] = []
        for item in decodes:
            seq = item.seq
            position = seq.num_computed_tokens
            if item.num_new_tokens != 1 or item.spec_token_ids or position + 1 != len(seq.token_ids):
                return None
            ids.append(seq.token_ids[position])
            positions.append(position)
            slots.append(seq.block_table[position // bs] * bs + position % bs)
            tables.append(seq.block_table[: position // bs + 1])
        num_blocks = max(map(len, tables))
        if num_blocks > self.max_blocks:
            return None
        padded = array.array("q")
        for table in tables:
            padded.extend(table)
            padded.extend([0] * (num_blocks - len(table)))
        lens = array.array("q", (p + 1 for p in positions))
        return StepRows(ids + positions + slots + lens, padded, num_blocks)

    def run(self, step: StepRows) -> torch.Tensor:
        """The step's logits [M, vocab] fp32 (a view of the graph's buffer for an fp32 lm_head)."""
        rows = len(step.ints) // 4
        copy_rows(step.ints, self.step_ints, 4, rows)
        copy_rows(step.tables, self.block_tables, rows, step.num_blocks)
        if not self.embeds_in_graph:
            with torch.inference_mode():
                self.hidden[:rows].copy_(self.model.embed(self.step_ints[0, :rows]))
        cpu_kernels.run_step_graph(self.ops, rows)
        return self.logits[:rows].float()

    @property
    def buffer_bytes(self) -> int:
        """Bytes of the persistent buffers the captured calls read and write (every tensor this graph
        allocated; vLLM logs its CUDA graphs' memory): stats() and the startup log report it."""
        values = list(vars(self).values())
        if self.moe_buffers is not None:
            values += [*self.moe_buffers.activations, self.moe_buffers.workspace]
        tensors = [t for value in values for t in (value if isinstance(value, tuple) else [value])]
        return sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))


def copy_rows(values: array.array, buffer: torch.Tensor, count: int, width: int) -> None:
    """values (count rows of width int64s) into the first width columns of buffer's first count rows, by
    memmove: a step's few host-to-buffer copies without torch calls (each cost tens of microseconds after
    the weights' stream evicted the caches)."""
    address, _ = values.buffer_info()
    stride, item = buffer.stride(0) * 8, 8 * width
    assert buffer.dtype == torch.int64 and len(values) == count * width and count <= buffer.shape[0]
    for row in range(count):
        ctypes.memmove(buffer.data_ptr() + row * stride, address + row * item, item)
