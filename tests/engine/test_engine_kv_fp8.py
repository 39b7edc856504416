"""fp8 KV cache (kv_cache_dtype, vLLM's names): the CPU kernels store and read fp8 exactly as the PyTorch
path does, the pool holds twice the blocks in the same memory and frees them all, the planner predicts
its bytes, and the default model's greedy choices agree with the bf16-KV run on >= 95% of positions."""

from __future__ import annotations

import pytest
import torch

from backend.engine import LLM, SamplingParams, cpu_kernels
from backend.engine.attention import write_kv_cache
from backend.planner import PlanRequest, estimate
from benchmarks.kv_cache import PROMPTS, top1_agreement
from tests.engine_utils import assert_engine_clean, prompts, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
KV_SCALES = (0.5, 2.0)  # not 1.0, so that a scale applied twice or not at all shows


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_cache_write_rounds_and_clamps_like_torch(dtype, cache_dtype):
    gen = torch.Generator().manual_seed(0)
    tokens, heads, kv_heads, head_dim, num_blocks, block_size = 7, 4, 2, 16, 4, 4
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    qkv[:, ::3] *= 300  # beyond e4m3's 448 after scaling: clamped
    qkv[:, 1::3] *= 1e-3  # fp8 subnormals
    qkv = qkv.to(dtype)
    k = qkv.view(tokens, -1, head_dim)[:, heads : heads + kv_heads]
    v = qkv.view(tokens, -1, head_dim)[:, heads + kv_heads :]
    cos, sin = torch.ones(8, head_dim, dtype=dtype), torch.zeros(8, head_dim, dtype=dtype)  # RoPE = identity
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    shape = (kv_heads, num_blocks, block_size, head_dim)
    expected = [torch.zeros(shape, dtype=cache_dtype) for _ in range(2)]
    write_kv_cache(k, v, *expected, slots, KV_SCALES)
    got = [torch.zeros(shape, dtype=cache_dtype) for _ in range(2)]
    positions = torch.zeros(tokens, dtype=torch.long)
    cpu_kernels.rope_and_cache(qkv.clone(), positions, cos, sin, slots, *got, heads, KV_SCALES)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    limit = torch.finfo(cache_dtype).max
    assert expected[0].float().abs().max() <= limit and not expected[0].float().isnan().any()


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_reads_an_fp8_pool_like_its_upcast_copy(dtype, cache_dtype):
    gen = torch.Generator().manual_seed(1)
    num_heads, num_kv_heads, head_dim, num_blocks, block_size = 8, 2, 32, 12, 16
    shape = (num_kv_heads, num_blocks, block_size, head_dim)
    k8 = (torch.randn(shape, generator=gen) * 3).to(cache_dtype)
    v8 = (torch.randn(shape, generator=gen) * 3).to(cache_dtype)
    lens = torch.tensor([1, 16, 17, 60])
    tables = torch.stack([torch.randperm(num_blocks, generator=gen)[:4] for _ in lens])
    q = torch.randn(len(lens), num_heads, head_dim, generator=gen).to(dtype)
    scale = head_dim**-0.5
    out = torch.empty_like(q)
    cpu_kernels.paged_decode_attention(q, k8, v8, tables, lens, scale, out, KV_SCALES)
    upcast_k, upcast_v = k8.float() * KV_SCALES[0], v8.float() * KV_SCALES[1]
    expected = torch.empty_like(q, dtype=torch.float32)
    cpu_kernels.paged_decode_attention(q.float(), upcast_k, upcast_v, tables, lens, scale, expected)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: one rounding of the output
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("kernels", ["1", "0"], ids=["cpu-kernels", "pytorch"])
def test_fp8_pool_holds_twice_the_tokens_and_frees_every_block(kernels, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_CPU_KERNELS", kernels)
    folder = tiny_model("llama")[0]
    common = dict(dtype="bfloat16", device="cpu", kv_cache_memory_bytes=1 << 20, max_num_batched_tokens=16)
    auto, fp8 = LLM(folder, **common), LLM(folder, kv_cache_dtype="fp8", **common)
    assert fp8.llm_engine.runner.decode_kernel is (kernels == "1")
    auto_stats, fp8_stats = auto.stats(), fp8.stats()
    assert fp8_stats.num_kv_blocks_total == 2 * auto_stats.num_kv_blocks_total
    assert fp8_stats.kv_pool_bytes == auto_stats.kv_pool_bytes
    assert fp8.llm_engine.runner.kv_caches[0][0].dtype == torch.float8_e4m3fn
    batch = prompts(seed=4)  # chunked prefills read the fp8 pool back, decodes too
    outs = fp8.generate(batch, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outs] == [12] * len(batch)
    assert_engine_clean(fp8)


def test_planner_predicts_the_fp8_pool_and_the_launch_export_carries_it():
    from backend.export import ExportOptions, embedded, resolve

    req = PlanRequest(model="m.gguf", engine="embedded", quant="gguf", kv_cache_dtype="fp8")
    config = embedded.EmbeddedExporter().engine_config(resolve(req, ExportOptions()))
    assert config.kv_cache_dtype == "fp8" and "--kv-cache-dtype" in config.cli_args()


@pytest.mark.slow
def test_default_model_fp8_kv_agrees_with_bf16_kv_and_the_planner_counts_its_bytes():
    from backend.default_model import packaged_gguf

    gguf = str(packaged_gguf())
    common = dict(device="cpu", max_num_seqs=2, max_num_batched_tokens=64)
    reference, fp8 = LLM(gguf, **common), LLM(gguf, kv_cache_dtype="fp8", **common)
    agreement = top1_agreement(reference, fp8, list(PROMPTS), 32)
    print(f"fp8 (e4m3) KV: top-1 agreement {agreement:.1%} with the {reference.dtype} KV run")
    assert agreement >= 0.95
    assert_engine_clean(fp8)
    stats = fp8.stats()
    plan = estimate(
        PlanRequest(model=gguf, gpu="cpu", engine="embedded", quant="auto", kv_cache_dtype="fp8",
                    max_num_seqs=2, max_num_batched_tokens=64, gpu_memory_utilization=1.0)
    )  # fmt: skip
    assert plan.kv_cache_bytes == pytest.approx(stats.kv_pool_bytes, rel=0.05)
    # one byte an element against the reference's dtype (bf16 where the CPU has bf16 units, else fp32)
    itemsize = torch.empty(0, dtype=reference.dtype).element_size()
    assert itemsize * stats.kv_pool_bytes == pytest.approx(reference.stats().kv_pool_bytes, rel=0.01)
