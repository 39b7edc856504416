"""GGUF weights kept quantized: the block decoders against gguf-py's reference dequantization, the CPU
kernels (each instruction-set build) against it, and whole engines on quantized weights token-identical to
the same engine on the dequantized weights in fp32, for every kept type (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import dequantize

from backend.engine import LLM, SamplingParams, cpu_kernels
from backend.engine.quantization.gguf_blocks import KEPT_TYPES
from backend.engine.quantization.gguf_blocks import dequantize as torch_dequantize
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.quantized_linear import QuantizedLinear, Scratch
from tests.common_utils import ROOT
from tests.engine_utils import assert_engine_clean
from tests.gguf_utils import Q, random_blocks, write_tiny_gguf

needs_kernels = pytest.mark.skipif(
    not cpu_kernels.supports(torch.device("cpu"), torch.float32), reason="no C++ compiler"
)
ROWS, COLS = 48, 512


def blocks_of(qtype, seed=0) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks [ROWS, bytes], gguf-py's dequantization [ROWS, COLS] fp32)."""
    data = random_blocks(qtype, ROWS, COLS, np.random.default_rng(seed))
    return torch.from_numpy(data), torch.from_numpy(dequantize(data, qtype)).reshape(ROWS, COLS)


@pytest.mark.parametrize("qtype", list(KEPT_TYPES), ids=lambda t: t.name)
def test_pytorch_decoding_equals_gguf_py(qtype):
    data, reference = blocks_of(qtype)
    assert torch.equal(torch_dequantize(data, KEPT_TYPES[qtype]), reference)


@needs_kernels
@pytest.mark.parametrize("qtype", list(KEPT_TYPES), ids=lambda t: t.name)
def test_kernels_match_gguf_py(qtype):
    data, reference = blocks_of(qtype, seed=1)
    name = KEPT_TYPES[qtype]
    assert torch.equal(cpu_kernels.quant_dequant(data, name, torch.empty(ROWS, COLS)), reference)
    bf16 = cpu_kernels.quant_dequant(data, name, torch.empty(ROWS, COLS, dtype=torch.bfloat16))
    assert torch.equal(bf16, reference.bfloat16())
    for rows in range(1, cpu_kernels.QUANT_GEMV_MAX_ROWS + 1):
        x = torch.randn(rows, COLS)
        out = torch.full(
            (rows, ROWS + 3), float("nan")
        )  # a wider output: the kernel writes columns 0..ROWS-1
        cpu_kernels.quant_gemv(x, data, name, None, out)
        exact = x.double() @ reference.double().T
        bound = 1e-5 * (x.abs().double() @ reference.abs().double().T) + 1e-6
        assert ((out[:, :ROWS].double() - exact).abs() <= bound).all()
        assert out[:, ROWS:].isnan().all()


CHECK_BUILD = """
import sys, numpy as np, torch
from gguf import dequantize
from backend.engine import cpu_kernels
from backend.engine.quantization.gguf_blocks import KEPT_TYPES
from tests.gguf_utils import random_blocks
print(cpu_kernels.build_flags())
for qtype, name in KEPT_TYPES.items():
    data = random_blocks(qtype, 16, 512, np.random.default_rng(0))
    reference = torch.from_numpy(dequantize(data, qtype))
    x = torch.randn(3, 512)
    out = torch.empty(3, 16)
    cpu_kernels.quant_gemv(x, torch.from_numpy(data), name, None, out)
    assert torch.allclose(out, x @ reference.T, rtol=1e-4, atol=1e-4), name
"""


@needs_kernels
@pytest.mark.slow
@pytest.mark.parametrize(("march", "width"), [("haswell", "AVX2+FMA"), ("x86-64", "scalar")])
def test_each_instruction_set_build_computes_the_same(march, width):
    env = os.environ | {"PLAYGROUND_CPU_KERNELS_MARCH": march, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", CHECK_BUILD], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert f"quantized kernels: {width}" in result.stdout


@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernels", "pytorch"])
def test_fused_layer_of_mixed_types_with_bias(use_kernel):
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
def test_mixed_types_token_identical_to_dequantized_fp32(mixed_gguf, caplog, monkeypatch):
    """14 sequences: decode batches above and below the fused kernel's row limit, prefill through tiles."""
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
def test_tied_quantized_embedding_token_identical(tied_q4_0_gguf):
    tokens, stats = greedy(str(tied_q4_0_gguf))
    assert tokens == greedy(str(tied_q4_0_gguf), dequantize_weights=True)[0]
    assert stats.quantization == "gguf Q4_0 (15 tensors)"
