"""The prepared native calls of a captured decode step (csrc/step_graph.cpp runs them): one Op per kernel
call, holding the kernel's address, its signature and its arguments, pointers into tensors that outlive
the graph (weights, the KV pool, the graph's buffers), and the slot of the row count each step sets.

`linear_ops` says, for a projection, which calls compute it, or why none do (then the model stays eager).
"""

from __future__ import annotations

import ctypes
from enum import IntEnum

import torch

from backend.engine import cpu_kernels
from backend.engine.device import cpu_has_fast_bf16
from backend.engine.layers.attention import AttentionSpec
from backend.engine.layers.fused_moe.native import NativeMoE
from backend.engine.layers.linear import Linear
from backend.engine.layers.norm import RMSNorm
from backend.engine.quantization.column_tiles import ColumnTiles
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.interleaved import Interleaved
from backend.engine.quantization.quantized_linear import QuantizedEmbedding, QuantizedLinear

MAX_INTS, MAX_FLOATS = 16, 3  # csrc/step_graph.cpp


class Signature(IntEnum):  # csrc/step_graph.cpp's, with the argument lists written there
    GEMM = 0
    GEMM_BF16 = 1
    RMS_NORM = 2
    ADD_RMS_NORM = 3
    SILU_AND_MUL = 4
    ROPE_AND_CACHE = 5
    DECODE_ATTENTION = 6
    INTERLEAVED = 7
    EMBEDDING = 8
    WIDEN = 9
    MOE = 10
    QK_NORM = 11


class Op(ctypes.Structure):
    _fields_ = [
        ("function", ctypes.c_void_p),
        ("signature", ctypes.c_int64),
        ("rows_slot", ctypes.c_int64),
        ("ints", ctypes.c_int64 * MAX_INTS),
        ("floats", ctypes.c_float * MAX_FLOATS),
    ]


def op(
    name: str, signature: Signature, rows_slot: int, ints: list[int], floats: tuple[float, ...] = ()
) -> Op:
    """A call of the kernel named name (pointers and sizes in ints; ints[rows_slot] is set each step)."""
    return Op(cpu_kernels.kernel_address(name), signature, rows_slot, (ctypes.c_int64 * MAX_INTS)(*ints),
              (ctypes.c_float * MAX_FLOATS)(*floats))  # fmt: skip


def ptr(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.data_ptr()


def unsupported_linear(module: object, dtype: torch.dtype) -> str | None:
    """Why a projection has no captured calls (None: it has). A quantized one's parts are interleaved or in
    column tiles (column_tiles_gemm: up to INT8_MAX_ROWS rows), or
    GGUF blocks kept row by row (the K-types; every type on a CPU without AVX512_BF16) that quant_gemv
    serves for up to QUANT_GEMV_MAX_ROWS rows (Q6_K: quant_gemm, Q6_K_GEMM_MAX_ROWS; row_limit), in the
    CPU's own compute dtype (bf16 with fast bf16, else fp32: what dtype "auto" picks and the planner
    plans, memory_plan)."""
    if isinstance(module, Linear):
        if module.native_weight is not None or module.dense_f32:
            return None
        return "a projection not on gemm_bf16 (oneDNN or torch)"
    if isinstance(module, QuantizedLinear):
        rows_ok = dtype == (torch.bfloat16 if cpu_has_fast_bf16() else torch.float32)
        if module.use_kernel and all(
            isinstance(part, Interleaved | ColumnTiles) or (rows_ok and is_gguf_rows(part))
            for part in module.parts
        ):
            return None
        kinds = sorted({type(part).__name__ for part in module.parts})
        return (
            f"a quantized projection neither interleaved nor GGUF rows in this CPU's compute dtype "
            f"({', '.join(kinds)}, {str(dtype).removeprefix('torch.')})"
        )
    return f"a projection of type {type(module).__name__}"


def is_gguf_rows(part: object) -> bool:
    """GGUF blocks kept row by row (not interleaved) of a type quant_gemv serves."""
    return isinstance(part, QuantizedWeight) and part.qtype in cpu_kernels.QUANT_TYPES


def row_limit(module: Linear | QuantizedLinear) -> int | None:
    """The most rows module's captured calls take (None: any): for GGUF rows quant_gemv's, or Q6_K's
    quant_gemm's (past it the eager module takes other kernels, so a step with more rows runs the modules)."""
    parts = module.parts if isinstance(module, QuantizedLinear) else []
    rows = [gguf_rows_limit(p.qtype) for p in parts if isinstance(p, QuantizedWeight) and is_gguf_rows(p)]
    tiles = [cpu_kernels.INT8_MAX_ROWS for p in parts if isinstance(p, ColumnTiles)]  # column_tiles_gemm's
    return min(rows + tiles, default=None)


def gguf_rows_kernel(qtype: str) -> tuple[str, int]:
    """gguf_rows_ops' kernel for qtype and the most rows it takes: quant_gemm for Q6_K (any build, fp32 or
    bf16; quant_gemv within it up to QUANT_GEMV_MAX_ROWS) and for Q4_0 where the build has AVX2's int8 rows
    (csrc/int8_avx2.h), quant_gemv for the others."""
    if qtype == "q6_k":
        return "quant_gemm", cpu_kernels.Q6_K_GEMM_MAX_ROWS
    if qtype == "q4_0" and cpu_kernels.int8_dot_kind() == "avx2":
        return "quant_gemm", cpu_kernels.INT8_MAX_ROWS
    return "quant_gemv", cpu_kernels.QUANT_GEMV_MAX_ROWS


def gguf_rows_limit(qtype: str) -> int:
    """The most rows gguf_rows_ops' kernel takes."""
    return gguf_rows_kernel(qtype)[1]


def linear_ops(module: Linear | QuantizedLinear, x: torch.Tensor, out: torch.Tensor) -> list[Op]:
    """y = module(x) into out ([rows, out_features] rows of x [rows, in_features]); a fused gate_up
    (Linear.fused_silu_and_mul) gives silu(gate) * up, [rows, out_features / 2], as its silu_and_mul()."""
    ldy = out.stride(0)
    if isinstance(module, Linear) and module.dense_f32:  # an fp32 router
        ints = [x.data_ptr(), ptr(module.weight), ptr(module.bias), out.data_ptr(), 0]
        return [op("linear_f32", Signature.GEMM, 4, [*ints, module.out_features, module.in_features, ldy])]
    if isinstance(module, Linear):
        w, n, k = ptr(module.native_weight), module.out_features, module.in_features
        if module.fused_silu_and_mul:
            ints = [x.data_ptr(), w, ptr(module.packed_bias), out.data_ptr(), 0, n, k, ldy]
            return [op("gemm_bf16_silu_and_mul", Signature.GEMM, 4, ints)]
        float_out = int(out.dtype == torch.float32)
        ints = [x.data_ptr(), w, ptr(module.packed_bias), out.data_ptr(), 0, n, k, ldy, float_out]
        return [op("gemm_bf16", Signature.GEMM_BF16, 4, ints)]
    ops, start = [], 0
    float_out = int(out.dtype == torch.float32)  # an lm_head's fp32 logits (QuantizedLinear.float_output)
    for part in module.parts:
        stop = start + part.shape[0]
        bias = None if module.bias is None else module.bias[start:stop]
        y = out[:, start].data_ptr()
        if isinstance(part, QuantizedWeight | ColumnTiles):
            ops += gguf_rows_ops(x, part, bias, out, y)
        else:
            assert isinstance(part, Interleaved)
            groups = 0 if part.groups is None else part.groups.address  # packed kinds' scales, zeros, perm
            ints = [x.data_ptr(), ptr(part.data), ptr(bias), y, 0, *part.shape, ldy, groups, float_out]
            ops.append(op(f"interleaved_gemm_{part.qtype}", Signature.INTERLEAVED, 4, ints))
        start = stop
    return ops


def gguf_rows_ops(
    x: torch.Tensor, part: QuantizedWeight | ColumnTiles, bias: torch.Tensor | None, out: torch.Tensor, y: int
) -> list[Op]:
    """quant_gemv (Q6_K: quant_gemm; Q4_0 in column tiles: q4_0x8_gemm) of x into out's columns at y; into
    fp32 logits from bf16 x (an lm_head, one part) it writes the bf16 values at each row's start, then
    widens them there (the eager path's .float())."""
    suffix = cpu_kernels.SUFFIX[x.dtype]
    if isinstance(part, ColumnTiles):
        name = f"q4_0x8_gemm_{suffix}"
    else:
        name = f"{gguf_rows_kernel(part.qtype)[0]}_{part.qtype}_{suffix}"
    n, k = part.shape
    ints = [x.data_ptr(), ptr(part.data), ptr(bias), y, 0, n, k, out.stride(0)]
    if out.dtype == x.dtype:
        return [op(name, Signature.GEMM, 4, ints)]
    assert out.dtype == torch.float32 and n == out.shape[1] == out.stride(0), "an lm_head of one part"
    ints[7] = 2 * n  # bf16 rows as far apart as the fp32 ones
    return [op(name, Signature.GEMM, 4, ints), op("widen_bf16_rows", Signature.WIDEN, 1, [y, 0, n])]


def embedding_op(embedding: object, ids: torch.Tensor, out: torch.Tensor) -> Op | None:
    """out [rows] = the embeddings of ids [rows] (int64), a dense table's rows copied or an interleaved Q8_0
    weight's rows decoded as the eager module decodes them; None for other embeddings (the step's torch call
    embeds then)."""
    if isinstance(embedding, torch.nn.Embedding) and embedding.weight.dtype == out.dtype:
        row_bytes = embedding.weight.shape[1] * embedding.weight.element_size()
        ints = [ids.data_ptr(), embedding.weight.data_ptr(), out.data_ptr(), 0, row_bytes]
        return op("embedding_rows", Signature.EMBEDDING, 3, ints)
    weight = embedding.weight_q if isinstance(embedding, QuantizedEmbedding) else None
    if isinstance(weight, Interleaved) and weight.qtype == "q8_0" and out.dtype == torch.bfloat16:
        ints = [ids.data_ptr(), weight.data.data_ptr(), out.data_ptr(), 0, weight.shape[1]]
        return op("interleaved_embedding_q8_0", Signature.EMBEDDING, 3, ints)
    return None


def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> Op:
    ints = [x.data_ptr(), weight.data_ptr(), out.data_ptr(), 0, x.shape[1]]
    return op(cpu_kernels.kernel_name("rms_norm", x.dtype), Signature.RMS_NORM, 3, ints, (eps,))


def add_rms_norm_op(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    sum_out: torch.Tensor,
) -> Op:
    """out = rms_norm(x + residual), sum_out = x + residual (sum_out must not be residual: __restrict)."""
    ints = [
        x.data_ptr(),
        residual.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        sum_out.data_ptr(),
        0,
        x.shape[1],
    ]
    return op(cpu_kernels.kernel_name("add_rms_norm", x.dtype), Signature.ADD_RMS_NORM, 5, ints, (eps,))


def qk_norm_op(qkv: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm, spec: AttentionSpec) -> Op:
    """A layer's q/k norm in place in qkv [S, (H + 2 KVH) * D] (cpu_kernels.qk_norm)."""
    ints = [qkv.data_ptr(), q_norm.weight.data_ptr(), k_norm.weight.data_ptr(), 0, spec.num_heads]
    ints += [spec.num_kv_heads, spec.head_dim, int(spec.qk_norm_across_heads)]
    return op(cpu_kernels.kernel_name("qk_norm", qkv.dtype), Signature.QK_NORM, 3, ints, (q_norm.eps,))


def silu_and_mul_op(gate_up: torch.Tensor, out: torch.Tensor) -> Op:
    ints = [gate_up.data_ptr(), out.data_ptr(), 0, out.shape[1]]
    return op(cpu_kernels.kernel_name("silu_and_mul", out.dtype), Signature.SILU_AND_MUL, 2, ints)


def gelu_tanh_and_mul_op(gate_up: torch.Tensor, out: torch.Tensor) -> Op:
    """out [S, I] = gelu(gate, approximate="tanh") * up of gate_up [S, 2 I] (cpu_kernels.gelu_tanh_and_mul)"""
    ints = [gate_up.data_ptr(), out.data_ptr(), 0, out.shape[1]]
    return op(cpu_kernels.kernel_name("gelu_tanh_and_mul", out.dtype), Signature.SILU_AND_MUL, 2, ints)


# GatedMLP.hidden_act -> the captured call of its activation (as layers/mlp.py's KERNELS)
ACTIVATION_OPS = {"silu": silu_and_mul_op, "gelu_pytorch_tanh": gelu_tanh_and_mul_op}


def rope_and_cache_op(
    qkv: torch.Tensor,  # [S, (H + 2 KVH) * D]
    positions: torch.Tensor,  # [S] int64
    slots: torch.Tensor,  # [S] int64
    rope: tuple[torch.Tensor, torch.Tensor] | None,  # the layer's cos, sin [max_positions, rotary_dim]
    kv_cache: tuple[torch.Tensor, torch.Tensor],  # [KVH, num_blocks, block_size, D] each
    num_heads: int,
    kv_scales: tuple[float, float],
    rotary_dim: int | None = None,  # cpu_kernels.rope_and_cache's (None: head_dim; 0: no RoPE, rope None)
) -> Op:
    k_cache, v_cache = kv_cache
    kv_heads, num_blocks, block_size, head_dim = k_cache.shape
    cos, sin = rope if rope is not None else (None, None)
    width = cpu_kernels.rotary_width(rotary_dim, head_dim, cos)
    pointers = [ptr(qkv), ptr(positions), ptr(cos), ptr(sin), ptr(slots), ptr(k_cache), ptr(v_cache)]
    ints = [*pointers, 0, num_heads, kv_heads, head_dim, num_blocks * block_size, width]
    floats = (*kv_scales, cpu_kernels.cache_limit(k_cache.dtype))
    name = cpu_kernels.kernel_name("rope_and_cache", qkv.dtype, k_cache.dtype)
    return op(name, Signature.ROPE_AND_CACHE, 7, ints, floats)


def decode_attention_op(
    qkv: torch.Tensor,  # [S, (H + 2 KVH) * D]: q is each row's first H * D
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    block_tables: torch.Tensor,  # [S, max_blocks] int64
    context_lens: torch.Tensor,  # [S] int64
    out: torch.Tensor,  # [S, H * D]
    scale: float,
    kv_scales: tuple[float, float],
    *,
    sliding_window: int | None = None,  # cpu_kernels.paged_decode_attention's
    soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,  # [H] fp32, kept alive by the caller as long as the graph
) -> Op:
    k_cache, v_cache = kv_cache
    kv_heads, num_blocks, block_size, head_dim = k_cache.shape
    num_heads = out.shape[1] // head_dim
    pointers = [qkv, k_cache, v_cache, block_tables, context_lens, out]
    ints = [t.data_ptr() for t in pointers] + [cpu_kernels.sinks_pointer(sinks, num_heads) or 0]
    ints += [0, num_heads, kv_heads, head_dim, num_blocks, block_size, block_tables.shape[1], qkv.stride(0)]
    ints.append(sliding_window or 0)
    floats = (scale * kv_scales[0], kv_scales[1], soft_cap or 0.0)
    name = cpu_kernels.kernel_name("paged_decode_attention", out.dtype, k_cache.dtype)
    return op(name, Signature.DECODE_ATTENTION, 7, ints, floats)


def moe_op(
    native: NativeMoE,
    x: torch.Tensor,  # [S, H]
    logits: torch.Tensor,  # [S, E]: the router's output
    shared: tuple[torch.Tensor | None, torch.Tensor | None],  # a shared expert's output [S, H], gate [S, 1]
    out: torch.Tensor,  # [S, H]
    workspace: torch.Tensor,  # uint8, native.workspace_bytes(S)
) -> Op:
    """A MoE block's routing, routed experts and combine in one call (csrc/moe.cpp), the eager module's."""
    ints = [native.address, x.data_ptr(), logits.data_ptr(), ptr(shared[0]), ptr(shared[1]), out.data_ptr()]
    return op(f"moe_forward_{native.suffix}", Signature.MOE, 7, [*ints, workspace.data_ptr(), 0])
