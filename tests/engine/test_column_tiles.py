"""GGUF Q4_0 in 8-column tiles (quantization/column_tiles.py, csrc/quantized.cpp q4_0x8_gemm): the layout
gives the GGUF blocks back bit for bit (rows, embedding lookups, decoding); and, on a build for AVX2 without
AVX-512 (PLAYGROUND_CPU_ISA=avx2 in a child process, so that every x86 machine with AVX2 runs it), the
tiles' kernel gives the int8 path's output of the blocks as stored bit for bit from 2 rows and within
the int8 rounding's bound at every row count, decodes as quant_dequant does, writes nothing past n, and
an engine loading a Q4_0 GGUF file holds its Q4_0 layers (and a tied embedding) as tiles, decodes 8
sequences together, and agrees with its exact paths as the rounding lets it."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from backend.cpu_features import cpu_features
from backend.engine import cpu_kernels
from backend.engine.quantization import column_tiles
from backend.engine.quantization.gguf_blocks import dequantize
from backend.engine.quantization.gguf_reader import QuantizedWeight
from tests.common_utils import ROOT
from tests.gguf_utils import Q, random_blocks


def q4_0(n: int, k: int, seed: int) -> QuantizedWeight:
    data = random_blocks(Q.Q4_0, n, k, np.random.default_rng(seed))
    return QuantizedWeight("q4_0", torch.from_numpy(data), (n, k))


def test_tiles_give_the_blocks_back():
    weight = q4_0(40, 544, seed=1)  # 5 groups of 8 columns, 17 blocks
    tiles = column_tiles.tile(weight)
    assert tiles.data.shape == (5, 17 * 144) and tiles.data.numel() == weight.data.numel()
    assert torch.equal(tiles.blocks(0, 40), weight.data)
    assert torch.equal(tiles.blocks(3, 29), weight.data[3:29])  # ends inside groups
    ids = torch.tensor([39, 0, 8, 7, 21, 21])
    assert torch.equal(tiles.gather(ids), weight.data[ids])
    assert torch.equal(tiles.dequantize_rows(8, 24), dequantize(weight.data[8:24], "q4_0"))


def test_tile_layout_is_the_kernels():
    """Group 0, block 1: the 8 columns' fp16 d, then vector v's lane c = column c's quant bytes 4 v..4 v + 3
    (csrc/int8_avx2.h tile_load reads it so)."""
    weight = q4_0(16, 64, seed=2)
    block = column_tiles.tile(weight).data[0, 144:288]
    stored = weight.data.view(16, 2, 18)[:8, 1]  # columns 0..7, block 1
    assert torch.equal(block[:16], stored[:, :2].reshape(-1))
    for v in range(4):
        assert torch.equal(block[16 + 32 * v : 48 + 32 * v], stored[:, 2 + 4 * v : 6 + 4 * v].reshape(-1))


def test_only_q4_0_in_whole_groups_takes_tiles():
    assert column_tiles.can_tile(q4_0(16, 64, seed=0))
    assert not column_tiles.can_tile(q4_0(12, 64, seed=0))  # n not a multiple of 8
    q8_0 = torch.from_numpy(random_blocks(Q.Q8_0, 16, 64, np.random.default_rng(0)))
    assert not column_tiles.can_tile(QuantizedWeight("q8_0", q8_0, (16, 64)))


AVX2_CHECK = """
import sys
from pathlib import Path

import torch
from backend.engine import LLM, SamplingParams, cpu_kernels
from backend.engine.quantization import column_tiles
from backend.engine.quantization.quantized_linear import QuantizedEmbedding, QuantizedLinear, Scratch
from backend.engine.quantization.gguf_blocks import dequantize
from tests.engine.test_column_tiles import q4_0
from tests.engine_utils import assert_engine_clean, count_identical_within_top5
from tests.gemm_utils import within_int8_error
from tests.gguf_utils import LINEAR_KINDS, Q, write_tiny_gguf

assert cpu_kernels.int8_dot_kind() == "avx2", cpu_kernels.build_flags()
assert cpu_kernels.column_tiles_available()
weight = q4_0(40, 544, seed=3)
tiles = column_tiles.tile(weight)
reference = dequantize(weight.data, "q4_0")
for dtype in (torch.float32, torch.bfloat16):
    decoded = torch.empty(16, 544, dtype=dtype)
    cpu_kernels.column_tiles_dequant(tiles, 8, 24, decoded)
    assert torch.equal(decoded, reference[8:24].to(dtype))
    bias = torch.randn(40).to(dtype)
    for rows in (1, 2, 3, 8, 9, 17, 33, 64):
        x = torch.randn(rows, 544).to(dtype)
        out, stored = (torch.full((rows, 44), float("nan"), dtype=dtype) for _ in range(2))
        cpu_kernels.column_tiles_gemm(x, tiles, bias, out)
        cpu_kernels.quant_gemm(x, weight.data, "q4_0", bias, stored)  # the int8 path on the blocks as stored
        assert out[:, 40:].isnan().all(), rows
        assert within_int8_error(out[:, :40], x, reference, bias, block=32), (dtype, rows)
        if rows > 1:  # one row: the stored blocks' column kernel sums in another order
            assert torch.equal(out[:, :40], stored[:, :40]), (dtype, rows)
layer = QuantizedLinear([weight], False, Scratch(), torch.float32)
layer.use_kernel = True
assert isinstance(layer.parts[0], column_tiles.ColumnTiles) and layer.gemm_rows(torch.float32) == 64
x = torch.randn(65, 544)  # past the int8 rows: tiles decoded for torch's GEMM, exact
torch.testing.assert_close(layer(x), x @ reference.T, rtol=1e-5, atol=1e-5)

linear = dict.fromkeys(LINEAR_KINDS, Q.Q4_0)
path = write_tiny_gguf(Path(sys.argv[1]), linear, Q.Q4_0, seed=4)  # tied: the output matrix is the embedding
prompts = [[1, 2, 3, 4, 5], [100, 200, 300], [7] * 40, list(range(1000, 1100))]
prompts += [[i, i + 1] for i in range(10, 14)]
params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=5)
outs = []
for q4_0_rows in (1, 0):  # tiles (int8), then the blocks as stored, exact
    cpu_kernels.set_int8_dot_rows(q4_0_rows, 0)
    llm = LLM(str(path), dtype="float32", max_model_len=256, max_num_seqs=8)
    model = llm.llm_engine.runner.model
    kinds = {type(m.parts[0]).__name__ for m in model.modules() if isinstance(m, QuantizedLinear)}
    assert kinds == ({"ColumnTiles"} if q4_0_rows else {"QuantizedWeight"}), kinds
    embedding = next(m for m in model.modules() if isinstance(m, QuantizedEmbedding))
    assert isinstance(embedding.weight_q, column_tiles.ColumnTiles) == bool(q4_0_rows)  # tied: one copy
    outs.append([out.outputs[0] for out in llm.generate(prompts, params)])
    assert_engine_clean(llm)
tiled, exact = outs
assert any(a.logprobs != b.logprobs for a, b in zip(tiled, exact, strict=True))
assert count_identical_within_top5(tiled, exact) >= len(prompts) // 2
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not cpu_features().has("avx2", "fma", "f16c")
    or not cpu_kernels.supports(torch.device("cpu"), torch.float32),
    reason="needs a C++ compiler and a CPU with AVX2, FMA and F16C",
)
def test_avx2_build_multiplies_and_decodes_through_tiles(tmp_path):
    env = os.environ | {"PLAYGROUND_CPU_ISA": "avx2", "PYTHONPATH": str(ROOT)}
    env.pop("PLAYGROUND_INT8_DOT", None)
    env.pop("PLAYGROUND_CPU_KERNELS_MARCH", None)
    done = subprocess.run(
        [sys.executable, "-c", AVX2_CHECK, str(tmp_path / "tiny-q4_0.gguf")],
        env=env, capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().endswith("ok")
