"""rope_and_cache with partial rotary (Phi-3) and without RoPE (SmolLM3's NoPE layers), and
gelu_tanh_and_mul (Gemma's gelu_pytorch_tanh MLP): the kernels against transformers' own functions and the
PyTorch twins, and their captured-step ops (graph_ops.py, replayed by csrc/step_graph.cpp) against the eager
kernel calls, bit for bit, as is the decode-attention op with a window, a soft-cap and sinks. qk_norm (Qwen3's
per-head and OLMoE's across-heads q/k norm, in place) against transformers' RMSNorm classes, and linear_f32
(an fp32 MoE router) against torch, with their ops against the eager calls."""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F

from backend.engine import attention, cpu_kernels, graph_ops
from backend.engine.attention import write_kv_cache

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(
        not cpu_kernels.supports(torch.device("cpu"), torch.float32), reason="no C++ compiler"
    ),
]
HEADS, KV_HEADS, HEAD_DIM, NUM_BLOCKS, BLOCK_SIZE = 6, 2, 64, 20, 16


def rope_inputs(dtype, tokens, rotary_dim, seed=4):
    """(qkv, positions, cos, sin, slots): tables [300, rotary_dim] as transformers builds them (each half
    the same frequencies), positions and slots random."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen).to(dtype)
    angles = torch.arange(300)[:, None] * torch.rand(rotary_dim // 2, generator=gen).repeat(2)[None, :]
    positions = torch.randint(0, 300, (tokens,), generator=gen)
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=gen)[:tokens]
    return qkv, positions, angles.cos().to(dtype), angles.sin().to(dtype), slots


def empty_caches(dtype) -> list[torch.Tensor]:
    return [torch.zeros(KV_HEADS, NUM_BLOCKS, BLOCK_SIZE, HEAD_DIM, dtype=dtype) for _ in range(2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 70])  # 70: over the kernels' threshold for a parallel region
@pytest.mark.parametrize("rotary_dim", [64, 48, 16])  # all of the head, Phi-3's 0.75 and 0.25 factors
def test_partial_rotary_matches_transformers_phi3_exactly(dtype, tokens, rotary_dim):
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

    qkv, positions, cos, sin, slots = rope_inputs(dtype, tokens, rotary_dim)
    heads = qkv.view(tokens, -1, HEAD_DIM)
    q, k = heads[:, :HEADS].transpose(0, 1)[None], heads[:, HEADS : HEADS + KV_HEADS].transpose(0, 1)[None]
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos[positions][None], sin[positions][None])  # [1, heads, T, D]
    expected_caches = empty_caches(dtype)
    write_kv_cache(k_ref[0].transpose(0, 1), heads[:, HEADS + KV_HEADS :], *expected_caches, slots)
    for rope_and_cache in (cpu_kernels.rope_and_cache, attention.rope_and_cache):
        got, caches = qkv.clone(), empty_caches(dtype)
        rope_and_cache(got, positions, cos, sin, slots, *caches, HEADS, rotary_dim=rotary_dim)
        got_heads = got.view(tokens, -1, HEAD_DIM)
        assert torch.equal(got_heads[:, :HEADS], q_ref[0].transpose(0, 1)), rope_and_cache.__module__
        assert torch.equal(got_heads[:, HEADS : HEADS + KV_HEADS], k_ref[0].transpose(0, 1))
        assert torch.equal(got_heads[:, HEADS + KV_HEADS :], heads[:, HEADS + KV_HEADS :])  # v untouched
        for a, b in zip(caches, expected_caches, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_rope_layer_only_writes_the_cache(dtype, kv_dtype):
    """rotary_dim 0 (a NoPE layer: no tables): q and k as projected, k and v written (fp8: scaled)."""
    qkv, positions, _, _, slots = rope_inputs(dtype, 9, 64)
    heads = qkv.view(9, -1, HEAD_DIM)
    kv_scales = (1.0, 1.0) if kv_dtype is None else (0.5, 2.0)
    expected_caches = empty_caches(kv_dtype or dtype)
    write_kv_cache(
        heads[:, HEADS : HEADS + KV_HEADS], heads[:, HEADS + KV_HEADS :], *expected_caches, slots, kv_scales
    )
    for rope_and_cache in (cpu_kernels.rope_and_cache, attention.rope_and_cache):
        got, caches = qkv.clone(), empty_caches(kv_dtype or dtype)
        rope_and_cache(got, positions, None, None, slots, *caches, HEADS, kv_scales, rotary_dim=0)
        assert torch.equal(got, qkv)
        for a, b in zip(caches, expected_caches, strict=True):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_tanh_and_mul_matches_torch(dtype):
    gen = torch.Generator().manual_seed(1)
    for rows, dim in ((5, 48), (70, 1000)):  # 1000: chunks and a tail; 70 rows: a parallel region
        gate_up = (torch.randn(rows, 2 * dim, generator=gen) * 4).to(dtype)
        gate_up[0, :6] = torch.tensor([-12.0, -6.0, -3.0, 0.0, 1e-3, 9.0]).to(dtype)  # tails and the middle
        expected = F.gelu(gate_up[:, :dim], approximate="tanh") * gate_up[:, dim:]
        got = cpu_kernels.gelu_tanh_and_mul(gate_up)
        exact = 0 if dtype == torch.float32 else 1e-2  # bf16: an ulp where the fp32 gelus round apart
        torch.testing.assert_close(got, expected, atol=1e-5 + exact, rtol=1e-5 + exact)
        if dtype == torch.bfloat16:
            assert (got != expected).float().mean() < 1e-2


def replay(op: graph_ops.Op, rows: int) -> None:
    cpu_kernels.run_step_graph((graph_ops.Op * 1)(op), rows)


@pytest.mark.parametrize("rotary_dim", [None, 48, 0])
def test_rope_and_cache_op_equals_the_eager_call(rotary_dim):
    width = HEAD_DIM if rotary_dim is None else rotary_dim
    qkv, positions, cos, sin, slots = rope_inputs(torch.bfloat16, 5, width or 64)
    rope = None if width == 0 else (cos, sin)
    expected, expected_caches = qkv.clone(), empty_caches(torch.bfloat16)
    tables = (None, None) if rope is None else rope
    cpu_kernels.rope_and_cache(
        expected, positions, *tables, slots, *expected_caches, HEADS, rotary_dim=rotary_dim
    )
    caches = empty_caches(torch.bfloat16)
    op = graph_ops.rope_and_cache_op(
        qkv, positions, slots, rope, tuple(caches), HEADS, (1.0, 1.0), rotary_dim
    )
    replay(op, 5)
    assert torch.equal(qkv, expected)
    for a, b in zip(caches, expected_caches, strict=True):
        assert torch.equal(a, b)


def test_gelu_tanh_and_mul_op_equals_the_eager_call():
    gate_up = torch.randn(4, 2 * 96, generator=torch.Generator().manual_seed(2)).bfloat16()
    out = torch.full((4, 96), float("nan"), dtype=torch.bfloat16)
    replay(graph_ops.gelu_tanh_and_mul_op(gate_up, out), 4)
    assert torch.equal(out, cpu_kernels.gelu_tanh_and_mul(gate_up))


@pytest.mark.parametrize(
    ("sliding_window", "soft_cap", "with_sinks"), [(None, None, False), (20, None, False), (7, 30.0, True)]
)
def test_decode_attention_op_equals_the_eager_call(sliding_window, soft_cap, with_sinks):
    gen = torch.Generator().manual_seed(3)
    rows, pool = 4, (KV_HEADS, NUM_BLOCKS, BLOCK_SIZE, HEAD_DIM)
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen).bfloat16()
    kv_cache = (torch.randn(pool, generator=gen).bfloat16(), torch.randn(pool, generator=gen).bfloat16())
    tables = torch.stack([torch.randperm(NUM_BLOCKS, generator=gen)[:8] for _ in range(rows)])
    lens = torch.tensor([3, 40, 100, 128])
    sinks = torch.randn(HEADS, generator=gen) if with_sinks else None
    features = {"sliding_window": sliding_window, "soft_cap": soft_cap, "sinks": sinks}
    expected = torch.empty(rows, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    q = qkv.view(rows, -1, HEAD_DIM)[:, :HEADS]
    cpu_kernels.paged_decode_attention(q, *kv_cache, tables, lens, 0.125, expected, (1.0, 1.0), **features)
    out = torch.full((rows, HEADS * HEAD_DIM), float("nan"), dtype=torch.bfloat16)
    op = graph_ops.decode_attention_op(qkv, kv_cache, tables, lens, out, 0.125, (1.0, 1.0), **features)
    assert op.rows_slot == 7 and ctypes.sizeof(op) == cpu_kernels.step_graph_op_size()
    replay(op, rows)
    assert torch.equal(out.view(rows, HEADS, HEAD_DIM), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 70])
@pytest.mark.parametrize("across_heads", [False, True])
def test_qk_norm_matches_transformers_in_place(dtype, tokens, across_heads):
    """Qwen3's per-head q/k norm and OLMoE's across all heads (transformers' own RMSNorm classes), in place
    in the fused projection's output; v untouched."""
    from transformers.models.olmoe.modeling_olmoe import OlmoeRMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen).to(dtype)
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=1)
    norm = OlmoeRMSNorm if across_heads else Qwen3RMSNorm
    q_norm, k_norm = (
        norm(width, eps=1e-6).to(dtype)
        for width in ((HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM) if across_heads else (HEAD_DIM,) * 2)
    )
    for module in (q_norm, k_norm):
        module.weight.data = torch.randn(module.weight.shape, generator=gen).to(dtype)
    with torch.no_grad():
        if across_heads:
            expected_q, expected_k = q_norm(q), k_norm(k)
        else:
            expected_q = q_norm(q.reshape(tokens, HEADS, HEAD_DIM)).reshape(tokens, -1)
            expected_k = k_norm(k.reshape(tokens, KV_HEADS, HEAD_DIM)).reshape(tokens, -1)
    v_before = v.clone()
    cpu_kernels.qk_norm(qkv, q_norm.weight, k_norm.weight, HEADS, KV_HEADS, across_heads, 1e-6)
    exact = 0 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(q, expected_q, atol=1e-5 + exact, rtol=exact)
    torch.testing.assert_close(k, expected_k, atol=1e-5 + exact, rtol=exact)
    assert torch.equal(v, v_before)


@pytest.mark.parametrize("across_heads", [False, True])
def test_qk_norm_op_equals_the_eager_call(across_heads):
    from backend.engine.layers.attention import AttentionSpec
    from backend.engine.layers.norm import RMSNorm

    spec = AttentionSpec(
        HEADS, KV_HEADS, HEAD_DIM, 0.125, None, qk_norm=True, qk_norm_across_heads=across_heads
    )
    widths = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM) if across_heads else (HEAD_DIM, HEAD_DIM)
    gen = torch.Generator().manual_seed(6)
    norms = [RMSNorm(width, 1e-5).bfloat16() for width in widths]
    for norm in norms:
        norm.weight.data = torch.randn(norm.weight.shape, generator=gen).bfloat16()
    qkv = torch.randn(8, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen).bfloat16()
    expected = qkv[:3].clone()
    cpu_kernels.qk_norm(expected, norms[0].weight, norms[1].weight, HEADS, KV_HEADS, across_heads, 1e-5)
    untouched = qkv[3:].clone()
    replay(graph_ops.qk_norm_op(qkv, *norms, spec), 3)
    assert torch.equal(qkv[:3], expected)
    assert torch.equal(qkv[3:], untouched)  # rows past the step's are not the step's


@pytest.mark.parametrize("bias", [False, True])
def test_fp32_router_matches_torch_and_its_captured_call_the_module(bias):
    """A MoE router in an fp32 model (a CPU without fast bf16) is linear_f32 eager and captured: torch's
    product to float rounding, and the captured call the module's output bit for bit, at any row count."""
    from backend.engine.layers.linear import Linear

    gen = torch.Generator().manual_seed(7)
    router = Linear(200, 24, bias=bias)
    router.weight.data = torch.randn(24, 200, generator=gen)
    if bias:
        router.bias.data = torch.randn(24, generator=gen)
    router.is_router = True
    expected_at = {rows: torch.randn(rows, 200, generator=gen) for rows in (1, 5, 70)}
    with torch.no_grad():
        reference = {rows: F.linear(x, router.weight, router.bias) for rows, x in expected_at.items()}
        router.prepare()
        assert router.dense_f32 and graph_ops.unsupported_linear(router, torch.float32) is None
        x, out = torch.zeros(70, 200), torch.full((70, 24), float("nan"))
        ops = graph_ops.linear_ops(router, x, out)
        for rows, rows_x in expected_at.items():
            got = router(rows_x)
            torch.testing.assert_close(got, reference[rows], atol=1e-4, rtol=1e-5)
            x[:rows] = rows_x
            cpu_kernels.run_step_graph((graph_ops.Op * len(ops))(*ops), rows)
            assert torch.equal(out[:rows], got), rows
