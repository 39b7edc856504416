"""The int8-activation kernels against gguf-py's dequantization in fp64, within the stated bound of
rounding each block of x to int8 (tests/gemm_utils.int8_error_bound), at 1, 2, 16 and 64 rows and the
tails the engine sees (an odd number of blocks, output columns past the last full tile, rows past a full
register of 16): csrc/int8_dot.h's (AVX512_VNNI: GGUF Q4_0 interleaved, csrc/interleaved_int8.h; Q6_K,
csrc/q6_k_int8.h; bf16 x) and csrc/int8_avx2.h's (AVX2 without AVX-512: Q4_0 and Q6_K as stored, fp32 or
bf16 x); that the kernels take the int8 paths exactly where the CPU has them and the rows are in range;
and an engine decoding through them."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from gguf import dequantize

from backend.cpu_features import cpu_features
from backend.engine import LLM, SamplingParams, cpu_kernels
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.interleaved import interleave
from tests.engine_utils import assert_engine_clean, count_identical_within_top5
from tests.gemm_utils import int8_error_bound, within_int8_error
from tests.gguf_utils import LINEAR_KINDS, Q, random_blocks, write_tiny_gguf

KERNELS = cpu_kernels.supports(torch.device("cpu"), torch.float32)
needs_int8 = pytest.mark.skipif(
    not cpu_kernels.supports(torch.device("cpu"), torch.bfloat16) or not cpu_kernels.int8_dot_available(),
    reason="the kernels' build lacks AVX512_VNNI (no csrc/int8_dot.h paths)",
)
needs_avx2_int8 = pytest.mark.skipif(
    not KERNELS or cpu_kernels.int8_dot_kind() != "avx2",
    reason="the kernels' build is not AVX2 without AVX-512 (no csrc/int8_avx2.h paths)",
)
needs_any_int8 = pytest.mark.skipif(
    not KERNELS or not cpu_kernels.int8_dot_kind(), reason="the kernels' build has no int8 paths"
)
ROWS = (1, 2, 3, 4, 9, 16, 17, 33, 64)
PROMPTS = [[1, 2, 3, 4, 5], [100, 200, 300], [7] * 40, list(range(1000, 1100))] + [
    [i, i + 1] for i in range(10, 14)
]


def gguf_weight(qtype, n: int, k: int, seed: int) -> tuple[QuantizedWeight, torch.Tensor]:
    data = random_blocks(qtype, n, k, np.random.default_rng(seed))
    reference = torch.from_numpy(dequantize(data, qtype)).reshape(n, k)
    return QuantizedWeight(qtype.name.lower(), torch.from_numpy(data), (n, k)), reference


@needs_int8
@pytest.mark.parametrize("k", [256, 768], ids=["1-super-block", "3-super-blocks"])
def test_q6_k_int8_within_bound(k):
    """37 output columns: 9 tiles of 4 and one column alone; rows in 1-4 lane groups of 16."""
    weight, reference = gguf_weight(Q.Q6_K, 37, k, seed=k)
    bias = torch.randn(37).bfloat16()
    for rows in ROWS:
        x = torch.randn(rows, k).bfloat16()
        out = torch.full((rows, 40), float("nan"), dtype=torch.bfloat16)
        cpu_kernels.quant_gemm(x, weight.data, "q6_k", bias, out, path="int8")
        assert within_int8_error(out[:, :37], x, reference, bias, block=256), rows
        assert out[:, 37:].isnan().all()
        scale = x.abs().double() @ reference.abs().double().T
        # the bound says something: d / 2 of a block of 256 normal values is about 1/90 of their mean |x|
        assert (int8_error_bound(x, reference, 256) <= 0.03 * scale).all()


@needs_int8
@pytest.mark.parametrize("float_out", [False, True], ids=["bf16-out", "fp32-out"])
def test_q4_0_interleaved_int8_within_bound(int8_rows, float_out):
    """4 panels of 16 columns, 17 blocks a row (odd); fp32 out: the bf16 values widened (an lm_head)."""
    weight, reference = gguf_weight(Q.Q4_0, 64, 544, seed=3)
    interleaved = interleave(weight)
    bias = torch.randn(64).bfloat16()
    int8_rows(1, 0)  # the int8 path from 1 row
    dtype = torch.float32 if float_out else torch.bfloat16
    for rows in ROWS:
        x = torch.randn(rows, 544).bfloat16()
        out = torch.full((rows, 67), 7.0, dtype=dtype)
        cpu_kernels.interleaved_gemm(x, interleaved, bias, out[:, :64])
        assert within_int8_error(out[:, :64], x, reference, bias, block=32), rows
        assert torch.equal(out[:, :64], out[:, :64].bfloat16().to(dtype))  # bf16 values
        assert (out[:, 64:] == 7.0).all()


@needs_int8
def test_q4_0_int8_matches_the_bf16_path_closely(int8_rows):
    """The two paths on the same call differ by int8's rounding of x only: well inside the bound, and
    not identical (the int8 path did run)."""
    weight, reference = gguf_weight(Q.Q4_0, 32, 2048, seed=4)
    interleaved = interleave(weight)
    x = torch.randn(16, 2048).bfloat16()
    outs = []
    for q4_0 in (1, 0):
        int8_rows(q4_0, 0)
        out = torch.empty(16, 32, dtype=torch.bfloat16)
        cpu_kernels.interleaved_gemm(x, interleaved, None, out)
        outs.append(out.double())
    int8, bf16 = outs
    assert not torch.equal(int8, bf16)
    assert ((int8 - bf16).abs() <= 2 * int8_error_bound(x, reference, 32) + bf16.abs() * 2.0**-7).all()


def test_int8_paths_only_where_the_cpu_has_them(monkeypatch):
    """The build has csrc/int8_dot.h's paths exactly where the CPU has AVX512_VNNI (and AVX512BW / VL,
    -march=native), csrc/int8_avx2.h's where it has AVX2, FMA and F16C but no AVX-512, and they run from
    the documented rows unless PLAYGROUND_INT8_DOT=0."""
    if not KERNELS:
        pytest.skip("no C++ compiler")
    if "PLAYGROUND_CPU_KERNELS_MARCH" in os.environ:
        pytest.skip("a build for another -march than this CPU's")
    cpu = cpu_features()
    has_vnni = cpu.has("avx512_vnni", "avx512bw", "avx512vl", "avx512f")
    has_avx2 = cpu.has("avx2", "fma", "f16c") and not cpu.has("avx512f")
    assert cpu_kernels.int8_dot_available() == has_vnni
    assert cpu_kernels.int8_dot_kind() == ("avx512_vnni" if has_vnni else "avx2" if has_avx2 else "")
    expected = (0, 0)
    if has_vnni:
        expected = (cpu_kernels.INT8_Q4_0_MIN_ROWS, cpu_kernels.INT8_Q6_K_MIN_ROWS)
    elif has_avx2:
        expected = (cpu_kernels.INT8_AVX2_Q4_0_MIN_ROWS, cpu_kernels.INT8_AVX2_Q6_K_MIN_ROWS)
    assert cpu_kernels.int8_dot_rows() == expected
    monkeypatch.setenv("PLAYGROUND_INT8_DOT", "0")
    assert cpu_kernels.int8_dot_rows() == (0, 0)
    assert cpu_kernels.quant_gemm_rows("q4_0", torch.float32) == 0  # AVX2's Q4_0 rows past 8: off too


def as_stored_product(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor, out: torch.Tensor
) -> None:
    """The engine's kernel for GGUF blocks as stored (QuantizedLinear.fused): quant_gemv up to 8 rows
    (Q6_K: quant_gemm at any rows), quant_gemm past it."""
    small = x.shape[0] <= cpu_kernels.QUANT_GEMV_MAX_ROWS and weight.qtype != "q6_k"
    kernel = cpu_kernels.quant_gemv if small else cpu_kernels.quant_gemm
    kernel(x, weight.data, weight.qtype, bias, out)


@needs_avx2_int8
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("qtype", "k"), [(Q.Q4_0, 544), (Q.Q6_K, 768)], ids=["q4_0-17-blocks", "q6_k-3-blocks"]
)
def test_avx2_int8_as_stored_within_bound(qtype, k, dtype, int8_rows):
    """37 output columns, bias, rows in 1-8 row groups and past them; each row set: within the bound, not
    the exact path's output (the int8 path ran) yet within twice the bound of it; nothing past column 37
    written. Past 64 rows (INT8_MAX_ROWS) Q4_0 has no quant_gemm here: the engine decodes tiles."""
    weight, reference = gguf_weight(qtype, 37, k, seed=k)
    bias = torch.randn(37).to(dtype)
    block = 32 if qtype == Q.Q4_0 else 256
    assert cpu_kernels.quant_gemm_rows(weight.qtype, dtype) == cpu_kernels.INT8_MAX_ROWS
    for rows in ROWS:
        x = torch.randn(rows, k).to(dtype)
        outs = []
        for setting in (cpu_kernels.int8_dot_rows(), (0, 0)):  # int8, exact
            int8_rows(*setting)
            outs.append(torch.full((rows, 40), float("nan"), dtype=dtype))
            as_stored_product(x, weight, bias, outs[-1])
            assert outs[-1][:, 37:].isnan().all()
        int8, exact = (out[:, :37] for out in outs)
        assert within_int8_error(int8, x, reference, bias, block=block), rows
        assert not torch.equal(int8, exact)
        assert ((int8 - exact).double().abs() <= 2 * int8_error_bound(x, reference, block) + 1e-4).all()


@needs_int8
def test_dispatch_takes_int8_in_its_row_range(int8_rows):
    """Default thresholds: quant_gemm (Q6_K) and interleaved_gemm (Q4_0) give the int8 path's output bit
    for bit from their first int8 row up to INT8_MAX_ROWS, the bf16 path's below it."""
    int8_rows(*cpu_kernels.int8_dot_rows())
    q6_k, _ = gguf_weight(Q.Q6_K, 20, 512, seed=5)
    q4_0 = interleave(gguf_weight(Q.Q4_0, 32, 512, seed=6)[0])
    for rows in (1, 2, 3, 4, 5, 16, cpu_kernels.INT8_MAX_ROWS):
        x = torch.randn(rows, 512).bfloat16()
        out, forced = (torch.empty(rows, 20, dtype=torch.bfloat16) for _ in range(2))
        cpu_kernels.quant_gemm(x, q6_k.data, "q6_k", None, out)
        cpu_kernels.quant_gemm(x, q6_k.data, "q6_k", None, forced, path="int8")
        assert torch.equal(out, forced) == (rows >= cpu_kernels.INT8_Q6_K_MIN_ROWS), rows
        outs = []
        for setting in (cpu_kernels.int8_dot_rows(), (1, 0), (0, 0)):  # default, int8, bf16
            int8_rows(*setting)
            outs.append(torch.empty(rows, 32, dtype=torch.bfloat16))
            cpu_kernels.interleaved_gemm(x, q4_0, None, outs[-1])
        int8_rows(*cpu_kernels.int8_dot_rows())
        takes_int8 = rows >= cpu_kernels.INT8_Q4_0_MIN_ROWS
        assert torch.equal(outs[0], outs[1 if takes_int8 else 2]), rows
    x = torch.randn(cpu_kernels.INT8_MAX_ROWS + 1, 512).bfloat16()  # past the range: the bf16 path
    outs = []
    for setting in (cpu_kernels.int8_dot_rows(), (0, 0)):
        int8_rows(*setting)
        outs.append(torch.empty(x.shape[0], 32, dtype=torch.bfloat16))
        cpu_kernels.interleaved_gemm(x, q4_0, None, outs[-1])
    assert torch.equal(outs[0], outs[1])


@pytest.fixture(scope="module")
def q4_0_q6_k_gguf(tmp_path_factory):
    """llama-quantize's Q4_0 mix in small: Q4_0 layers, a Q6_K output matrix (untied), a Q8_0 embedding."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-q4_0-mix.gguf"
    return write_tiny_gguf(path, dict.fromkeys(LINEAR_KINDS, Q.Q4_0), Q.Q8_0, output=Q.Q6_K, seed=3)


@needs_any_int8
@pytest.mark.slow
def test_engine_decode_steps_take_the_int8_paths(q4_0_q6_k_gguf, int8_rows):
    """An engine in the CPU's compute dtype (AVX512_VNNI: bf16; AVX2: fp32) decoding 8 sequences together
    (captured steps of 8 rows: both int8 paths) against the same engine with the int8 paths off: the
    log-probabilities differ (the int8 kernels ran), and the greedy continuations agree as the rounding
    lets them: identical, or where one first differs, each side's token among the other's top 5."""
    dtype = "bfloat16" if cpu_kernels.int8_dot_kind() == "avx512_vnni" else "float32"

    def run() -> list:
        llm = LLM(str(q4_0_q6_k_gguf), dtype=dtype, max_model_len=256, max_num_seqs=8)
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=5)
        outs = llm.generate(PROMPTS, params)
        assert_engine_clean(llm)
        return [out.outputs[0] for out in outs]

    int8_rows(*cpu_kernels.int8_dot_rows())
    ours = run()
    int8_rows(0, 0)
    exact = run()
    assert any(a.logprobs != b.logprobs for a, b in zip(ours, exact, strict=True))
    assert count_identical_within_top5(ours, exact) >= len(PROMPTS) // 2  # 7 of 8 on an EPYC
