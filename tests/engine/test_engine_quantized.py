"""GGUF weights kept quantized: the block decoders against gguf-py's reference dequantization, the CPU
kernels (each instruction-set build, fp32 and bf16 activations) against it, and whole engines on quantized
weights token-identical to the same engine on the dequantized weights in fp32, for every kept type (Q4_0,
Q4_1, Q8_0, Q4_K, Q6_K; Q6_K's batched kernel on every build); in bf16, against the same bf16 engine
multiplying by the fp32 dequantized weights (the function the kernels compute, up to the order of fp32
sums)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, dequantize

from backend.cpu_features import AVX512_CORE, cpu_features
from backend.engine import LLM, SamplingParams, cpu_kernels
from backend.engine.quantization.gguf_blocks import KEPT_TYPES
from backend.engine.quantization.gguf_blocks import dequantize as torch_dequantize
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.interleaved import Interleaved
from backend.engine.quantization.quantized_linear import QuantizedLinear, Scratch, dequantize_part
from tests.common_utils import ROOT
from tests.engine_utils import assert_engine_clean, count_identical_within_top5
from tests.gemm_utils import within_int8_error
from tests.gguf_utils import Q, random_blocks, write_tiny_gguf

CPU = cpu_features()  # the flags that decide which instruction-set builds run here

needs_kernels = pytest.mark.skipif(
    not cpu_kernels.supports(torch.device("cpu"), torch.float32), reason="no C++ compiler"
)
needs_gemm = pytest.mark.skipif(
    not cpu_kernels.supports(torch.device("cpu"), torch.float32) or not cpu_kernels.quant_gemm_max_rows(),
    reason="the kernels' build lacks AVX512_BF16 (no quant_gemm)",
)
ROWS, COLS = 48, 512
ODD_COLS = {32: 544, 256: 768}  # by block size: an odd number of blocks (the bf16 kernels pair blocks)


def blocks_of(qtype, seed=0, cols=COLS) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks [ROWS, bytes], gguf-py's dequantization [ROWS, cols] fp32)."""
    data = random_blocks(qtype, ROWS, cols, np.random.default_rng(seed))
    return torch.from_numpy(data), torch.from_numpy(dequantize(data, qtype)).reshape(ROWS, cols)


def assert_close_to_exact(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias=None) -> None:
    """out (x's dtype) within fp32 summation error of the exact x @ weight^T (+ bias), plus bf16's rounding
    of out."""
    exact = x.double() @ weight.double().T
    bound = 1e-5 * (x.abs().double() @ weight.abs().double().T) + 1e-6
    if bias is not None:
        exact += bias.double()
        bound += 1e-6 * bias.double().abs()
    if out.dtype == torch.bfloat16:
        bound += exact.abs() * 2.0**-8  # half a bf16 unit in the last place, and then some
    assert ((out.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("qtype", list(KEPT_TYPES), ids=lambda t: t.name)
def test_pytorch_decoding_equals_gguf_py(qtype):
    data, reference = blocks_of(qtype)
    assert torch.equal(torch_dequantize(data, KEPT_TYPES[qtype]), reference)


@needs_kernels
@pytest.mark.parametrize("int8", [False, True], ids=["exact", "int8-where-taken"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("odd", [False, True], ids=["even-blocks", "odd-blocks"])
@pytest.mark.parametrize("qtype", list(KEPT_TYPES), ids=lambda t: t.name)
def test_kernels_match_gguf_py(qtype, odd, dtype, int8, int8_rows):
    """quant_gemv at 1-8 rows: exact (int8 paths off), and as dispatched by default, where Q4_0 on AVX2
    builds rounds x to int8 (csrc/int8_avx2.h): within that rounding's bound."""
    int8_rows(*(cpu_kernels.int8_dot_rows() if int8 else (0, 0)))
    cols = ODD_COLS[GGML_QUANT_SIZES[qtype][0]] if odd else COLS
    data, reference = blocks_of(qtype, seed=1, cols=cols)
    name = KEPT_TYPES[qtype]
    decoded = cpu_kernels.quant_dequant(data, name, torch.empty(ROWS, cols, dtype=dtype))
    assert torch.equal(decoded, reference.to(dtype))  # bf16: rounded once, as torch rounds
    for rows in range(1, cpu_kernels.QUANT_GEMV_MAX_ROWS + 1):
        x = torch.randn(rows, cols).to(dtype)
        # a wider output: the kernel writes columns 0..ROWS-1
        out = torch.full((rows, ROWS + 3), float("nan"), dtype=dtype)
        cpu_kernels.quant_gemv(x, data, name, None, out)
        if (
            int8
            and name == "q4_0"
            and cpu_kernels.int8_dot_kind() == "avx2"
            and cpu_kernels.takes_int8(name, rows)
        ):
            assert within_int8_error(out[:, :ROWS], x, reference, None, block=32)
        else:
            assert_close_to_exact(out[:, :ROWS], x, reference)
        assert out[:, ROWS:].isnan().all()


@needs_gemm
@pytest.mark.parametrize("odd", [False, True], ids=["even-blocks", "odd-blocks"])
@pytest.mark.parametrize("name", cpu_kernels.QUANT_GEMM_TYPES)
def test_batched_kernel_matches_gguf_py(name, odd):
    """quant_gemm (bf16, up to quant_gemm_max_rows rows: rows in vector lanes, 16 a register), with a bias
    and rows that fill its registers partly; the same function as quant_gemv up to the order of sums."""
    (qtype,) = (t for t, n in KEPT_TYPES.items() if n == name)
    cols = ODD_COLS[32] if odd else COLS
    data, reference = blocks_of(qtype, seed=2, cols=cols)
    bias = torch.randn(ROWS).bfloat16()
    for rows in (1, 8, 9, 16, 17, 40, cpu_kernels.quant_gemm_max_rows()):
        x = torch.randn(rows, cols).bfloat16()
        out = torch.full((rows, ROWS + 3), float("nan"), dtype=torch.bfloat16)
        cpu_kernels.quant_gemm(x, data, name, bias, out)
        assert_close_to_exact(out[:, :ROWS], x, reference, bias)
        assert out[:, ROWS:].isnan().all()
        if rows <= cpu_kernels.QUANT_GEMV_MAX_ROWS:
            gemv = torch.empty(rows, ROWS, dtype=torch.bfloat16)
            cpu_kernels.quant_gemv(x, data, name, bias, gemv)
            torch.testing.assert_close(out[:, :ROWS], gemv, rtol=2**-7, atol=1e-5)


Q6_K_PATHS = [
    ("", torch.float32),
    ("", torch.bfloat16),
    ("portable", torch.bfloat16),
    ("lanes", torch.bfloat16),
]


@needs_kernels
@pytest.mark.parametrize(("path", "dtype"), Q6_K_PATHS, ids=["fp32", "bf16", "bf16-portable", "bf16-lanes"])
def test_q6_k_gemm_matches_gguf_py(path, dtype):
    """quant_gemm_q6_k (csrc/q6_k_gemm.cpp) on 37 output columns (a multiple of none of its column tiles:
    8, 4, 2 with bf16 lanes, 4 portable) and 3 super-blocks, at rows past quant_gemv's (9, 16, 33: partly
    filled lanes and row tiles) and at its ends: within fp32 summation error of the exact product with
    gguf-py's dequantization (plus bf16's rounding of the output), bias included, nothing past column 37
    written. "portable" and "lanes" force one path at any rows (on a build without AVX512_BF16 both are the
    portable one); rows that take an int8 path (AVX512_VNNI: bf16; AVX2: fp32 and bf16) within its bound
    (test_int8_dot.py)."""
    n, k = 37, 768
    data = torch.from_numpy(random_blocks(Q.Q6_K, n, k, np.random.default_rng(4)))
    reference = torch.from_numpy(dequantize(data.numpy(), Q.Q6_K)).reshape(n, k)
    bias = torch.randn(n).to(dtype)
    for rows in (1, 8, 9, 16, 33, cpu_kernels.Q6_K_GEMM_MAX_ROWS):
        x = torch.randn(rows, k).to(dtype)
        out = torch.full((rows, n + 3), float("nan"), dtype=dtype)
        cpu_kernels.quant_gemm(x, data, "q6_k", bias, out, path=path)
        if not path and cpu_kernels.takes_int8("q6_k", rows, dtype):  # x rounded to int8
            assert within_int8_error(out[:, :n], x, reference, bias, block=256)
        else:
            assert_close_to_exact(out[:, :n], x, reference, bias)
        assert out[:, n:].isnan().all()


CHECK_BUILD = """
import sys, numpy as np, torch
from gguf import dequantize
from backend.engine import cpu_kernels
from backend.engine.quantization.gguf_blocks import KEPT_TYPES
from tests.gguf_utils import random_blocks

from tests.gemm_utils import within_int8_error

print(cpu_kernels.build_flags())
print("int8 dot products:", cpu_kernels.int8_dot_kind() or "none")
for qtype, name in KEPT_TYPES.items():
    data = random_blocks(qtype, 16, 512, np.random.default_rng(0))
    reference = torch.from_numpy(dequantize(data, qtype))
    decoded = torch.empty(16, 512, dtype=torch.bfloat16)
    assert torch.equal(cpu_kernels.quant_dequant(torch.from_numpy(data), name, decoded), reference.bfloat16())
    for rows in (3, 20):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(rows, 512).to(dtype)
            expected = x.float() @ reference.T
            if rows <= cpu_kernels.QUANT_GEMV_MAX_ROWS:
                out = torch.empty(rows, 16, dtype=dtype)
                cpu_kernels.quant_gemv(x, torch.from_numpy(data), name, None, out)
            elif cpu_kernels.quant_gemm_rows(name, dtype) >= rows:
                out = torch.empty(rows, 16, dtype=dtype)
                cpu_kernels.quant_gemm(x, torch.from_numpy(data), name, None, out)
            else:
                continue
            tolerance = 1e-4 if dtype == torch.float32 else 1e-2
            as_stored_int8 = name == "q6_k" or cpu_kernels.int8_dot_kind() == "avx2"  # Q4_0: AVX2's rows
            if name in ("q4_0", "q6_k") and as_stored_int8 and cpu_kernels.takes_int8(name, rows, dtype):
                block = 256 if name == "q6_k" else 32
                assert within_int8_error(out, x, reference, None, block), (name, rows, dtype)
            else:
                close = torch.allclose(out.float(), expected, rtol=tolerance, atol=tolerance)
                assert close, (name, rows, dtype)
            if name == "q6_k" and dtype == torch.bfloat16:  # both of the build's paths past quant_gemv
                for path in ("portable", "lanes"):
                    cpu_kernels.quant_gemm(x, torch.from_numpy(data), name, None, out, path=path)
                    assert torch.allclose(out.float(), expected, rtol=tolerance, atol=tolerance), path
"""


@needs_kernels
@pytest.mark.slow
@pytest.mark.parametrize(
    ("march", "width", "int8"),
    [
        ("haswell", "AVX2+FMA;", "avx2"),  # csrc/int8_avx2.h's paths
        ("x86-64", "scalar;", "none"),
        pytest.param(  # AVX-512 without bf16 dot products: bf16 activations converted to fp32
            "skylake-avx512",
            "AVX-512;",
            "none",  # no AVX512_VNNI
            marks=pytest.mark.skipif(not CPU.has_avx512, reason="no AVX-512"),
        ),
        pytest.param(
            "cooperlake",
            "AVX-512 (bf16 dot products);",
            "avx512_vnni",  # csrc/int8_dot.h's paths
            marks=pytest.mark.skipif(
                not CPU.has(*AVX512_CORE, "avx512_vnni", "avx512_bf16"),
                reason="no AVX-512 bf16",
            ),
        ),
    ],
)
def test_each_instruction_set_build_computes_the_same(march, width, int8):
    env = os.environ | {"PLAYGROUND_CPU_KERNELS_MARCH": march, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", CHECK_BUILD], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert f"quantized kernels: {width}" in result.stdout
    assert f"int8 dot products: {int8}" in result.stdout  # AVX512_VNNI's, AVX2's (without AVX-512), none


@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernels", "pytorch"])
def test_bf16_layer_each_batch_size(use_kernel):
    """A fused layer of 4-bit parts in bf16 through each path: quant_gemv (up to 8 rows), quant_gemm (to
    quant_gemm_max_rows, where built) and decoded tiles with torch's GEMM (beyond; bf16-rounded weights)."""
    if use_kernel and not cpu_kernels.supports(torch.device("cpu"), torch.bfloat16):
        pytest.skip("no C++ compiler")
    parts, dense = [], []
    for seed, qtype in enumerate((Q.Q4_1, Q.Q4_1, Q.Q4_0)):  # gate, up (merged), and another type
        data, reference = blocks_of(qtype, seed)
        parts.append(QuantizedWeight(KEPT_TYPES[qtype], data, (ROWS, COLS)))
        dense.append(reference)
    layer = QuantizedLinear(parts, True, Scratch(), torch.bfloat16)
    assert len(layer.parts) == 2
    layer.bias.data.normal_()
    layer.use_kernel = use_kernel
    weight = torch.cat(dense)
    for rows in (1, 8, 9, 33, 64, 65, 150):
        x = torch.randn(rows, COLS).bfloat16()
        out = layer(x)
        assert out.dtype == torch.bfloat16 and out.shape == (rows, 3 * ROWS)
        expected = F.linear(x.float(), weight, layer.bias.float()).bfloat16()
        if isinstance(layer.parts[1], Interleaved) and cpu_kernels.takes_int8("q4_0", rows):
            # the Q4_0 part's x rounded to int8 (csrc/int8_dot.h): within that rounding's bound
            assert within_int8_error(out[:, 2 * ROWS :], x, dense[2], layer.bias[2 * ROWS :], block=32)
            out, expected = out[:, : 2 * ROWS], expected[:, : 2 * ROWS]
        torch.testing.assert_close(out, expected, rtol=2**-7, atol=0.02)


@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernels", "pytorch"])
def test_fused_layer_of_mixed_types_with_bias(use_kernel, exact_products):
    if use_kernel and not cpu_kernels.supports(torch.device("cpu"), torch.float32):
        pytest.skip("no C++ compiler")
    parts, dense = [], []
    for seed, qtype in enumerate((Q.Q4_K, Q.Q4_K, Q.Q6_K, Q.Q8_0)):  # q, k (merged), v, and another
        data, reference = blocks_of(qtype, seed)
        parts.append(QuantizedWeight(KEPT_TYPES[qtype], data, (ROWS, COLS)))
        dense.append(reference)
    layer = QuantizedLinear(parts, True, Scratch(), torch.float32)
    assert len(layer.parts) == 3  # the two Q4_K parts share one kernel call
    layer.bias.data.normal_()
    layer.use_kernel = use_kernel
    weight = torch.cat(dense)
    for rows in (1, 5, 8, 9, 40):
        x = torch.randn(rows, COLS)
        torch.testing.assert_close(layer(x), F.linear(x, weight, layer.bias), rtol=1e-4, atol=1e-4)


MIXED = {  # every kept type, a fused q/k/v and gate/up of different types, one type dequantized at load
    "attn_q": Q.Q4_K,
    "attn_k": Q.Q4_K,
    "attn_v": Q.Q6_K,
    "attn_output": Q.Q4_0,
    "ffn_gate": Q.Q4_1,
    "ffn_up": Q.Q4_1,
    "ffn_down": Q.Q5_0,
}


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-mixed.gguf", MIXED, Q.Q8_0, output=Q.Q6_K)


@pytest.fixture(scope="module")
def tied_q4_0_gguf(tmp_path_factory):
    all_q4_0 = dict.fromkeys(MIXED, Q.Q4_0)
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-q4_0.gguf", all_q4_0, Q.Q4_0, seed=1)


PROMPTS = [[1, 2, 3, 4, 5], [100, 200, 300], [7] * 40, list(range(1000, 1100))] + [
    [i, i + 1] for i in range(10, 20)
]


def greedy(model: str, **kwargs) -> tuple[list[list[int]], dict]:
    llm = LLM(model, dtype="float32", max_model_len=256, max_num_seqs=16, **kwargs)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert_engine_clean(llm)
    return [out.outputs[0].token_ids for out in outs], llm.stats()


@pytest.mark.slow
def test_mixed_types_token_identical_to_dequantized_fp32(mixed_gguf, caplog, monkeypatch, exact_products):
    """14 sequences: decode batches above and below the fused kernel's row limit, prefill through tiles
    (the int8 paths off: the exact function; test_int8_dot.py has them in an engine)."""
    with caplog.at_level(logging.WARNING):
        tokens, stats = greedy(str(mixed_gguf))
    assert "Q5_0 tensors dequantized at load" in caplog.text
    reference, dense_stats = greedy(str(mixed_gguf), dequantize_weights=True)
    assert tokens == reference
    for name in ("Q4_K", "Q6_K", "Q4_0", "Q4_1", "Q8_0"):
        assert name in stats.quantization
    assert dense_stats.quantization is None
    assert stats.weights_bytes < dense_stats.weights_bytes / 2
    monkeypatch.setenv("PLAYGROUND_CPU_KERNELS", "0")  # the PyTorch path (the one CUDA takes)
    assert greedy(str(mixed_gguf))[0] == reference


@pytest.mark.slow
def test_tied_quantized_embedding_token_identical(tied_q4_0_gguf, exact_products):
    tokens, stats = greedy(str(tied_q4_0_gguf))
    assert tokens == greedy(str(tied_q4_0_gguf), dequantize_weights=True)[0]
    assert stats.quantization == "gguf Q4_0 (15 tensors)"


@pytest.fixture(scope="module")
def q4_1_gguf(tmp_path_factory):  # the default model's types: Q4_1 layers, a tied Q8_0 embedding
    path = tmp_path_factory.mktemp("gguf") / "tiny-q4_1.gguf"
    return write_tiny_gguf(path, dict.fromkeys(MIXED, Q.Q4_1), Q.Q8_0, seed=2)


def fp32_weights_forward(self, x: torch.Tensor) -> torch.Tensor:
    """QuantizedLinear through the fp32 dequantized weights, rounded to x's dtype: what its bf16 kernels
    compute, up to the order of the fp32 sums."""
    weight = torch.cat([dequantize_part(part) for part in self.parts])
    bias = None if self.bias is None else self.bias.float()
    return F.linear(x.float(), weight, bias).to(x.dtype)


@pytest.mark.slow
@pytest.mark.parametrize("max_num_seqs", [4, 16], ids=["gemv", "gemm"])  # decode batches of 4, then of 14
@pytest.mark.parametrize("model", ["q4_1_gguf", "tied_q4_0_gguf"])
def test_bf16_kernels_agree_with_fp32_weights(model, max_num_seqs, request, monkeypatch):
    """bf16 rounds every layer's output, so a different order of fp32 sums moves a few values by a unit in
    the last place, and this tiny random model's greedy choices are close calls: most continuations stay
    identical, and where one first differs each side's token is among the other's top 5."""
    path = str(request.getfixturevalue(model))

    def run():
        llm = LLM(path, dtype="bfloat16", max_model_len=256, max_num_seqs=max_num_seqs)
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=5)
        outs = llm.generate(PROMPTS, params)
        assert_engine_clean(llm)
        return [out.outputs[0] for out in outs]

    ours = run()
    monkeypatch.setattr(QuantizedLinear, "forward", fp32_weights_forward)
    reference = run()
    assert count_identical_within_top5(ours, reference) >= len(PROMPTS) * 2 // 3
