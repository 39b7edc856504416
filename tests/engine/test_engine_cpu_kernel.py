"""The native CPU decode-attention kernel against PyTorch's scaled_dot_product_attention, and the engine
on its pure-PyTorch attention path (the one CUDA uses) against transformers."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from backend.engine import LLM, SamplingParams, cpu_kernels
from backend.engine.attention import write_kv_cache
from backend.engine.layers.rotary import apply_rope
from tests.engine_utils import (
    ARCHITECTURES,
    assert_engine_clean,
    hf_greedy,
    prompts,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def reference_decode(q, k_cache, v_cache, tables, lens, scale):
    """SDPA per query token over its blocks, gathered in order, in fp64."""
    kv_heads, _, block_size, head_dim = k_cache.shape
    outs = []
    for t in range(q.shape[0]):
        n = int(lens[t])
        blocks = tables[t, : -(-n // block_size)]
        keys = k_cache[:, blocks].reshape(kv_heads, -1, head_dim)[:, :n].double()
        values = v_cache[:, blocks].reshape(kv_heads, -1, head_dim)[:, :n].double()
        query = q[t].double()[None, :, None, :]  # [1, H, 1, D]
        o = F.scaled_dot_product_attention(query, keys[None], values[None], scale=scale, enable_gqa=True)
        outs.append(o[0, :, 0])
    return torch.stack(outs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 16), (9, 3, 64), (8, 1, 32)])
def test_kernel_matches_sdpa_through_shuffled_block_tables(dtype, num_heads, num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(0)
    num_blocks, block_size = 40, 16
    shape = (num_kv_heads, num_blocks, block_size, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    lens = torch.tensor([1, 15, 16, 17, 100, 33])  # around block boundaries
    max_blocks = -(-int(lens.max()) // block_size)
    tables = torch.stack([torch.randperm(num_blocks, generator=gen)[:max_blocks] for _ in lens])
    q = torch.randn(len(lens), num_heads, head_dim, generator=gen).to(dtype)
    out = torch.full_like(q, float("nan"))
    scale = head_dim**-0.5
    cpu_kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, out)
    expected = reference_decode(q, k_cache, v_cache, tables, lens, scale)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: one rounding of the output
    torch.testing.assert_close(out.double(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_covers_every_pair_once_on_several_threads(threads):
    """Pairs are handed out through a shared counter: with two threads each is still done exactly once."""
    gen = torch.Generator().manual_seed(5)
    shape = (3, 64, 16, 64)
    k_cache = torch.randn(shape, generator=gen).bfloat16()
    v_cache = torch.randn(shape, generator=gen).bfloat16()
    lens = torch.randint(1, 100, (37,), generator=gen)
    tables = torch.stack([torch.randperm(64, generator=gen)[:7] for _ in lens])
    q = torch.randn(len(lens), 9, 64, generator=gen).bfloat16()
    out = torch.full_like(q, float("nan"))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cpu_kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125, out)
    finally:
        torch.set_num_threads(previous)
    expected = reference_decode(q, k_cache, v_cache, tables, lens, 0.125)
    torch.testing.assert_close(out.double(), expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 70])  # 70: over the kernel's threshold for a parallel region
def test_rope_and_cache_match_the_pytorch_path_exactly(dtype, tokens):
    gen = torch.Generator().manual_seed(4)
    heads, kv_heads, head_dim, num_blocks, block_size = 6, 2, 64, 20, 16
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    cos = torch.randn(300, head_dim, generator=gen).to(dtype)
    sin = torch.randn(300, head_dim, generator=gen).to(dtype)
    positions = torch.randint(0, 300, (tokens,), generator=gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    shape = (kv_heads, num_blocks, block_size, head_dim)
    expected_cache = [torch.zeros(shape, dtype=dtype) for _ in range(2)]
    heads_view = qkv.view(tokens, -1, head_dim)
    half = head_dim // 2
    signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # as RopeTables.at builds it
    rotated = apply_rope(heads_view[:, : heads + kv_heads], cos[positions, None], signed_sin[positions, None])
    write_kv_cache(rotated[:, heads:], heads_view[:, heads + kv_heads :], *expected_cache, slots)
    got_cache = [torch.zeros(shape, dtype=dtype) for _ in range(2)]
    got = qkv.clone()
    cpu_kernels.rope_and_cache(got, positions, cos, sin, slots, *got_cache, heads)
    got_heads = got.view(tokens, -1, head_dim)
    assert torch.equal(got_heads[:, : heads + kv_heads], rotated)  # rounded as torch rounds, bit for bit
    assert torch.equal(got_heads[:, heads + kv_heads :], heads_view[:, heads + kv_heads :])  # v untouched
    for a, b in zip(got_cache, expected_cache, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 15, 16, 49152 + 7])
def test_argmax_matches_torch_ties_nans_and_infinities_included(dtype, n):
    gen = torch.Generator().manual_seed(6)
    rows = 6
    logits = torch.randn(rows, n, generator=gen)
    logits[1] = logits[1].round()  # many ties: the first index of the largest wins
    logits[2] = float("-inf")
    logits[3, n // 2] = float("nan")  # a NaN wins, as in torch
    logits[4, -1] = float("inf")
    logits[5, n // 3 :] = logits[5].max() + 1  # the largest value repeated through the tail
    logits = logits.to(dtype)
    assert cpu_kernels.argmax(logits) == logits.argmax(-1).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_silu_and_mul_match_transformers_arithmetic(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gen = torch.Generator().manual_seed(1)
    exact = 0 if dtype == torch.float32 else 1e-2
    # 70 x 100: a parallel region and rows that end mid-vector
    for rows, dim in ((5, 96), (70, 100)):
        x = torch.randn(rows, dim, generator=gen).to(dtype)
        norm = LlamaRMSNorm(dim, eps=1e-5).to(dtype)
        norm.weight.data = torch.randn(dim, generator=gen).to(dtype)
        torch.testing.assert_close(
            cpu_kernels.rms_norm(x, norm.weight, 1e-5), norm(x), atol=1e-5 + exact, rtol=exact
        )
        residual = torch.randn(rows, dim, generator=gen).to(dtype)
        x[0, :7] = torch.tensor([1e-39, -3e-39, 2e-40, 5e-41, 0.0, -1e-38, 1e-45]).to(dtype)  # subnormal sums
        residual[0, :7] = torch.tensor([2e-39, 1e-39, -3e-40, 1e-40, 0.0, 2e-39, 0.0]).to(dtype)
        normed, summed = cpu_kernels.add_rms_norm(x, residual, norm.weight, 1e-5)
        assert torch.equal(summed, x + residual)  # rounded as torch rounds the residual add, subnormals too
        torch.testing.assert_close(normed, norm(x + residual), atol=1e-5 + exact, rtol=exact)
    for rows, dim in ((5, 48), (70, 1000)):  # 1000: chunks of 64 and a tail; 70 rows: a parallel region
        gate_up = (torch.randn(rows, 2 * dim, generator=gen) * 4).to(dtype)
        expected = F.silu(gate_up[:, :dim]) * gate_up[:, dim:]
        got = cpu_kernels.silu_and_mul(gate_up)
        torch.testing.assert_close(got, expected, atol=1e-5 + exact, rtol=1e-6 + exact)  # fast_exp: 2e-7
        if dtype == torch.bfloat16:  # the same bf16 value but for an ulp where fast_exp's error crosses a tie
            assert (got != expected).float().mean() < 1e-3


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3])
def test_small_bf16_linear_matches_torch(rows, bias):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(rows, 200, generator=gen).bfloat16()
    weight = torch.randn(300, 200, generator=gen).bfloat16()
    b = torch.randn(300, generator=gen).bfloat16() if bias else None
    expected = F.linear(x.float(), weight.float(), None if b is None else b.float())
    torch.testing.assert_close(
        cpu_kernels.linear_bf16_small(x, weight, b).float(), expected, atol=0.1, rtol=1e-2
    )


def test_engine_on_cpu_uses_the_kernel_when_a_compiler_exists():
    llm = LLM(tiny_model("llama")[0], dtype="float32", device="cpu")
    has_compiler = (shutil.which("g++") or shutil.which("c++")) is not None
    assert llm.llm_engine.runner.decode_kernel is has_compiler


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_pytorch_attention_path_matches_transformers(arch, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_CPU_KERNELS", "0")
    llm = LLM(tiny_model(arch)[0], dtype="float32", device="cpu", max_num_batched_tokens=16)
    assert llm.llm_engine.runner.decode_kernel is False
    batch = prompts(seed=3)
    outs = llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=20))
    for prompt, out in zip(batch, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(arch, prompt, 20)
    assert_engine_clean(llm)
