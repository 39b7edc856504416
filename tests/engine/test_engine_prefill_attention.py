"""The native CPU prefill-attention kernel (csrc/prefill_attention.cpp) against an fp64 causal SDPA over
each chunk's gathered blocks: cached prefixes, block sizes, GQA ratios, fp8 pools, threads, and each
instruction-set build (there also the decode kernel with a window, a soft-cap and sinks, and
gelu_tanh_and_mul); and the engine on it against transformers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from backend.cpu_features import cpu_features
from backend.engine import LLM, SamplingParams, cpu_kernels
from tests.attention_utils import prefill_case, reference_prefill
from tests.common_utils import ROOT
from tests.engine_utils import assert_engine_clean, hf_greedy, prompts, tiny_model

CPU = cpu_features()  # the flags that decide which instruction-set builds run here

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(
        not cpu_kernels.supports(torch.device("cpu"), torch.float32), reason="no C++ compiler"
    ),
]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # bf16: the probabilities and the output rounded


def run_kernel(case) -> torch.Tensor:
    """The kernel's output: every row of q's shape, NaN where it did not write."""
    out = torch.full(case.q.shape, float("nan"), dtype=case.q.dtype)
    cpu_kernels.paged_prefill_attention(
        case.q, case.k_cache, case.v_cache, case.inputs, case.scale, out, case.kv_scales
    )
    return out


def assert_matches_reference(case) -> None:
    out, (first, end) = run_kernel(case), case.rows
    assert out[:first].isnan().all() and out[end:].isnan().all()  # decode rows and the rest untouched
    tol = TOLERANCE[case.q.dtype]
    torch.testing.assert_close(out[first:end].double(), reference_prefill(case), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(9, 3, 64), (4, 2, 16), (8, 1, 32), (4, 4, 80)])  # (H, KVH, D)
@pytest.mark.parametrize("block_size", [16, 5, 32])
def test_kernel_matches_causal_sdpa_with_and_without_cached_prefixes(dtype, shape, block_size):
    assert_matches_reference(prefill_case(dtype, shape, block_size))


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_reads_an_fp8_pool_with_its_scales(dtype, kv_dtype):
    assert_matches_reference(prefill_case(dtype, (9, 3, 64), 16, kv_dtype=kv_dtype))


def test_bf16_kernel_is_as_close_to_the_reference_as_torch_bf16_attention():
    """bf16 rounds the probabilities before the second product (as torch's CPU flash attention does): the
    error stays within what torch's own bf16 SDPA makes on the same inputs."""
    case = prefill_case(torch.bfloat16, (9, 3, 64), 16, seed=1)
    first, end = case.rows
    reference = reference_prefill(case)
    ours = (run_kernel(case)[first:end].double() - reference).abs()
    torch_bf16 = (reference_prefill(case, torch.bfloat16).double() - reference).abs()
    assert ours.max() <= 1.5 * torch_bf16.max() and ours.mean() <= 1.5 * torch_bf16.mean()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_work_item_is_done_once_on_several_threads(threads):
    """Packing then attention, in one parallel region: any thread count gives the same, exact result."""
    case = prefill_case(torch.float32, (9, 3, 64), 16, chunks=((200, 0), (64, 100), (3, 0)), seed=2)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = run_kernel(case)
    finally:
        torch.set_num_threads(previous)
    first, end = case.rows
    torch.testing.assert_close(out[first:end].double(), reference_prefill(case), atol=1e-5, rtol=1e-5)


CHECK_BUILD = """
import torch
from backend.engine import cpu_kernels
from tests.attention_utils import Features, prefill_case, reference_prefill
from tests.attention_utils import decode_inputs, reference_decode, reference_prefill_features
print("bf16 dot", int(cpu_kernels.prefill_attention_bf16_dot()))
for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
    for shape, block_size in (((9, 3, 64), 16), ((4, 2, 16), 5)):
        case = prefill_case(dtype, shape, block_size)
        out = torch.empty_like(case.q)
        cpu_kernels.paged_prefill_attention(case.q, case.k_cache, case.v_cache, case.inputs, case.scale, out)
        first, end = case.rows
        torch.testing.assert_close(out[first:end].double(), reference_prefill(case), atol=tol, rtol=tol)
        # a window (its edge tiles masked), a soft-cap and sinks, in the prefill and the decode kernel
        features = Features(20, 5.0, torch.linspace(-1.0, 2.0, shape[0]))
        cpu_kernels.paged_prefill_attention(
            case.q, case.k_cache, case.v_cache, case.inputs, case.scale, out, **features.kwargs()
        )
        expected = reference_prefill_features(case, features)
        torch.testing.assert_close(out[first:end].double(), expected, atol=tol, rtol=tol)
        q, k_cache, v_cache, tables, lens, kv_scales = decode_inputs(dtype, shape)
        out = torch.empty_like(q)
        scale = shape[2] ** -0.5
        cpu_kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, out, **features.kwargs())
        expected = reference_decode(q, k_cache, v_cache, tables, lens, kv_scales, features)
        torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)
    gate_up = torch.randn(7, 200).to(dtype) * 4
    expected = torch.nn.functional.gelu(gate_up[:, :100], approximate="tanh") * gate_up[:, 100:]
    torch.testing.assert_close(cpu_kernels.gelu_tanh_and_mul(gate_up), expected, atol=1e-5 + tol, rtol=tol)
print("prefill ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("march", "bf16_dot"),
    [
        ("x86-64", 0),  # plain C++
        ("haswell", 0),  # AVX2 + FMA
        pytest.param(
            "skylake-avx512",
            0,
            marks=pytest.mark.skipif(not CPU.has("avx512bw"), reason="no AVX-512"),
        ),
        pytest.param("native", 1, marks=pytest.mark.skipif(not CPU.has_avx512_bf16, reason="no AVX512_BF16")),
    ],
)
def test_each_instruction_set_build_computes_the_same(march, bf16_dot):
    env = os.environ | {"PLAYGROUND_CPU_KERNELS_MARCH": march, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", CHECK_BUILD], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert f"bf16 dot {bf16_dot}" in result.stdout and "prefill ok" in result.stdout


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_engine_on_the_prefill_kernel_matches_transformers(enable_prefix_caching):
    """Chunked prefill (a 16-token budget: every long prompt in several chunks, each after the first
    reading its earlier chunks from the pool) and prefix caching (a shared 32-token prefix)."""
    path = tiny_model("llama")[0]
    llm = LLM(path, dtype="float32", max_num_batched_tokens=16, enable_prefix_caching=enable_prefix_caching)
    assert llm.llm_engine.runner.prefill_kernel
    shared = prompts(lengths=(32,), seed=7)[0]
    batch = prompts(seed=8) + [shared + p for p in prompts(lengths=(1, 20, 40), seed=9)]
    params = SamplingParams(temperature=0.0, max_tokens=12)
    for _ in range(2):  # the second round hits the prefix cache where it is on
        outs = llm.generate(batch, params)
        for prompt, out in zip(batch, outs, strict=True):
            assert out.outputs[0].token_ids == hf_greedy("llama", prompt, 12)
    assert (llm.stats().prefix_cache_hits_total > 0) is enable_prefix_caching
    assert_engine_clean(llm)


def test_prefill_attention_switch_keeps_the_pytorch_path(monkeypatch):
    monkeypatch.setenv("PLAYGROUND_PREFILL_ATTENTION", "0")
    llm = LLM(tiny_model("llama")[0], dtype="float32", max_num_batched_tokens=16)
    runner = llm.llm_engine.runner
    assert runner.decode_kernel and not runner.prefill_kernel
    batch = prompts(seed=3)
    outs = llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=8))
    for prompt, out in zip(batch, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy("llama", prompt, 8)
    assert_engine_clean(llm)
