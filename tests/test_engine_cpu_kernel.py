"""The native CPU decode-attention kernel against PyTorch's scaled_dot_product_attention, and the engine
on its pure-PyTorch attention path (the one CUDA uses) against transformers."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from backend.engine import LLM, SamplingParams, cpu_kernels
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_silu_and_mul_match_transformers_arithmetic(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 96, generator=gen).to(dtype)
    norm = LlamaRMSNorm(96, eps=1e-5).to(dtype)
    norm.weight.data = torch.randn(96, generator=gen).to(dtype)
    exact = 0 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(
        cpu_kernels.rms_norm(x, norm.weight, 1e-5), norm(x), atol=1e-5 + exact, rtol=exact
    )
    residual = torch.randn(5, 96, generator=gen).to(dtype)
    normed, summed = cpu_kernels.add_rms_norm(x, residual, norm.weight, 1e-5)
    assert torch.equal(summed, x + residual)  # the residual add, rounded as torch rounds it
    torch.testing.assert_close(normed, norm(x + residual), atol=1e-5 + exact, rtol=exact)
    gate_up = torch.randn(5, 2 * 48, generator=gen).to(dtype)
    expected = F.silu(gate_up[:, :48]) * gate_up[:, 48:]
    torch.testing.assert_close(cpu_kernels.silu_and_mul(gate_up), expected, atol=1e-5 + exact, rtol=exact)


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
