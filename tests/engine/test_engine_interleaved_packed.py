"""GPTQ, AWQ and compressed-tensors 4- and 8-bit weights (and fp8 ones) in csrc/interleaved.cpp's 16-row
layout (quantization/interleaved.py with group_scales.py): the re-layout keeps the bytes (as many as the
checkpoint stores) and the weights (the PyTorch decoding equals the format's own, bit for bit); the kernel
computes x @ W^T + bias bit for bit where every fp32 step of the dequantized product is exact (so only a
wrong weight, scale, zero, order, or a rounding of the weights shows), within summation error elsewhere, at
every batch size; planted bugs (nibbles swapped, GPTQ's zero offset lost, act-order's input order ignored)
are caught; a bf16 engine runs a fused q/k/v as one part and generates the tokens of the packed_rows path,
its decode steps captured (decode_graph) or not."""

from __future__ import annotations

import pytest
import torch

from backend.engine import LLM, SamplingParams, cpu_kernels
from backend.engine.quantization.compressed_tensors import Fp8Weight
from backend.engine.quantization.gptq_awq import PACKED_SUFFIXES, PackedWeight
from backend.engine.quantization.interleaved import Interleaved, can_interleave, interleave
from backend.engine.quantization.quantized_linear import QuantizedLinear
from backend.engine.quantization.row_packed import relayout
from benchmarks.quant_checkpoints import Scheme, pack_columns, pack_rows, packed_tensors, write_checkpoint
from tests.engine_utils import assert_engine_clean, prompts
from tests.quant_pack_utils import tiny_dense_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
needs_interleaved = pytest.mark.skipif(
    not cpu_kernels.supports(torch.device("cpu"), torch.bfloat16) or not cpu_kernels.interleaved_available(),
    reason="the kernels' build lacks AVX512_BF16 (no interleaved kernels: packed_rows serves these weights)",
)
N, K = 80, 256  # 5 panels: split unevenly between threads


def gptq_awq(scheme: Scheme) -> PackedWeight:
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(scheme.bits))
    tensors, _ = packed_tensors("p", w, scheme, seed=3)
    g_idx = tensors.get("p.g_idx", torch.arange(K) // (K if scheme.group_size == -1 else scheme.group_size))
    parts = [tensors[f"p.{s}"] for s in PACKED_SUFFIXES[:3]]
    return PackedWeight(scheme.method, scheme.bits, *parts, g_idx, (N, K), "p.g_idx" in tensors)


def compressed(bits: int, group: int, sym: bool, actorder: bool, scale_dtype: torch.dtype) -> PackedWeight:
    """compressed-tensors pack-quantized: weight_packed [n, k / f], zero points [n / f, groups], scales
    [n, groups], values stored with a 2^(bits - 1) offset (see test_engine_packed_rows.py)."""
    gen = torch.Generator().manual_seed(bits + group)
    q = torch.randint(0, 1 << bits, (N, K), generator=gen)
    scales = torch.ones(N, K // group, dtype=scale_dtype)
    zeros = torch.zeros(0, dtype=torch.int32)
    if not sym:
        zeros = pack_rows(torch.randint(0, 1 << bits, (N, K // group), generator=gen), bits)
    g_idx = torch.arange(K) // group
    if actorder:
        g_idx = g_idx[torch.randperm(K, generator=gen)]
    packed = pack_columns(q, bits)
    return PackedWeight("compressed-tensors", bits, packed, zeros, scales, g_idx.int(), (N, K), actorder)


def fp8(exact: bool) -> Fp8Weight:
    """fp8 e4m3 weights with a scale a row (exact: magnitudes 0.5-15, scales of 7 bits; else every code but
    NaN, subnormals included)."""
    gen = torch.Generator().manual_seed(8)
    codes = torch.randint(0, 256, (N, K), generator=gen, dtype=torch.uint8)
    if exact:  # exponent fields 6-10
        codes = (codes & 0x87) | (torch.randint(6, 11, (N, K), generator=gen, dtype=torch.uint8) << 3)
    if not exact:
        codes[0, :256] = torch.arange(256, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C  # no NaN (a NaN weight makes a NaN product)
    scale = 1 + torch.randint(0, 64, (N, 1), generator=gen).float() / 64
    return Fp8Weight(codes.view(torch.float8_e4m3fn), scale, (N, K))


PARTS = {  # name: (the weight, the interleaved kind it takes)
    "gptq-w4-g128-sym": (lambda: gptq_awq(Scheme("gptq", 4, 128, sym=True)), "w4"),
    "gptq-w4-g32-desc_act-asym": (lambda: gptq_awq(Scheme("gptq", 4, 32, desc_act=True)), "w4_zp"),
    "gptq-w8-g64-desc_act-sym": (lambda: gptq_awq(Scheme("gptq", 8, 64, desc_act=True, sym=True)), "w8"),
    "gptq-w8-channel-asym": (lambda: gptq_awq(Scheme("gptq", 8, -1)), "w8_zp"),
    "awq-w4-g128": (lambda: gptq_awq(Scheme("awq", 4, 128)), "w4_zp"),
    "ct-w4-g32-asym-bf16": (lambda: compressed(4, 32, False, False, torch.bfloat16), "w4_zp"),
    "ct-w4-g128-sym-actorder": (lambda: compressed(4, 128, True, True, torch.float16), "w4"),
    "ct-w8-channel-sym-fp16": (lambda: compressed(8, K, True, False, torch.float16), "w8"),
    "ct-w8-g64-asym-fp32": (lambda: compressed(8, 64, False, False, torch.float32), "w8_zp"),
    "fp8-channel": (lambda: fp8(exact=True), "fp8"),
}
RANDOM = PARTS | {"fp8-every-code": (lambda: fp8(exact=False), "fp8")}


def with_exact_scales(part: PackedWeight | Fp8Weight) -> PackedWeight | Fp8Weight:
    """part with scales in [1, 2) of 11 significant bits (fp16; bf16: 8; 8-bit weights: 7): s (q - z) needs
    15-16 bits, so a weight rounded to bf16 anywhere shows, while every fp32 step of the product is exact
    (sums of x in {-1, 0, 1} times s (q - z) stay below 2^24 units of the scales' last bit)."""
    if isinstance(part, Fp8Weight):
        return part  # made so
    gen = torch.Generator().manual_seed(7)
    bits = 6 if part.bits == 8 else 10 if part.scales.dtype == torch.float16 else 7
    fraction = torch.randint(0, 1 << bits, part.scales.shape, generator=gen).float() / (1 << bits)
    part.scales = (1 + fraction).to(part.scales.dtype)
    return part


def interleaved(name: str, exact: bool = True) -> tuple[Interleaved, torch.Tensor]:
    """(the part interleaved, its format's own dequantization [N, K] fp32)."""
    make, kind = RANDOM[name]
    part = with_exact_scales(make()) if exact else make()
    rows = relayout(part)
    assert can_interleave(rows)
    result = interleave(rows)
    assert result.qtype == kind
    return result, part.dequantize_rows(0, N)


def small_integers(rows: int, seed: int) -> torch.Tensor:  # x in {-1, 0, 1}: every partial sum exact
    return torch.randint(-1, 2, (rows, K), generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.mark.parametrize("name", PARTS)
def test_relayout_keeps_the_bytes_and_the_weights(name):
    part = PARTS[name][0]()
    rows = relayout(part)
    result = interleave(rows)
    assert sum(t.nbytes for t in result.tensors()) == sum(t.nbytes for t in rows.tensors())
    assert result.data.nbytes == rows.qweight.nbytes
    assert not torch.equal(result.data.view(-1), rows.qweight.view(-1))  # it did move them
    reference = part.dequantize_rows(0, N)
    for first, last in ((0, N), (16, 48), (33, 34), (70, 80)):
        assert torch.equal(result.dequantize_rows(first, last), reference[first:last]), (first, last)


@needs_interleaved
@pytest.mark.parametrize("name", PARTS)
def test_kernel_is_bit_exact_at_every_batch_size(name):
    """Tiles of 1-8 rows x 1-4 panels, 8-row tiles past 8 rows, a wider output (ldy > n), a bias."""
    weight, reference = interleaved(name)
    bias = torch.randint(-4, 5, (N,)).bfloat16()
    for rows in (1, 2, 3, 4, 6, 7, 8, 9, 16, 17, 40):
        x = small_integers(rows, rows)
        out = torch.full((rows, N + 3), 7.0, dtype=torch.bfloat16)
        cpu_kernels.interleaved_gemm(x, weight, bias, out[:, :N])
        expected = (x.float() @ reference.T + bias.float()).bfloat16()  # exact, then rounded once
        assert torch.equal(out[:, :N], expected), rows
        assert (out[:, N:] == 7.0).all()  # nothing written past n


@needs_interleaved
@pytest.mark.parametrize(
    "name", ["gptq-w4-g32-desc_act-asym", "ct-w8-g64-asym-fp32", "awq-w4-g128", "fp8-every-code"]
)
def test_kernel_within_summation_error_on_random_inputs(name):
    weight, reference = interleaved(name, exact=False)
    for rows in (1, 5, 16):
        x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows)).bfloat16()
        out = torch.empty(rows, N, dtype=torch.bfloat16)
        cpu_kernels.interleaved_gemm(x, weight, None, out)
        exact = x.double() @ reference.double().T
        bound = 1e-5 * (x.abs().double() @ reference.abs().double().T) + exact.abs() * 2.0**-8 + 1e-6
        assert ((out.double() - exact).abs() <= bound).all(), rows


def kernel_equals_reference(weight: Interleaved, reference: torch.Tensor) -> bool:
    x = small_integers(4, 0)
    out = torch.empty(4, N, dtype=torch.bfloat16)
    cpu_kernels.interleaved_gemm(x, weight, None, out)
    return torch.equal(out, (x.float() @ reference.T).bfloat16())


@needs_interleaved
def test_planted_bugs_are_caught():
    weight, reference = interleaved("gptq-w4-g32-desc_act-asym")
    assert kernel_equals_reference(weight, reference)
    swapped = (weight.data >> 4) | (weight.data << 4)  # each chunk's two k-pairs exchanged
    planted = Interleaved(weight.qtype, swapped, weight.shape, weight.groups)
    assert not kernel_equals_reference(planted, reference)
    assert weight.groups is not None
    weight.groups.args.zero_add = 0  # GPTQ's stored zero - 1 taken as the zero
    assert not kernel_equals_reference(weight, reference)
    weight.groups.args.zero_add = 1
    weight.groups.args.perm = None  # act-order's input permutation ignored
    assert not kernel_equals_reference(weight, reference)


@needs_interleaved
@pytest.mark.parametrize(
    "scheme", [Scheme("gptq", 4, 32, desc_act=True), Scheme("awq", 4, 64), Scheme("gptq", 8, 128, sym=True)],
    ids=lambda s: s.name,
)  # fmt: skip
def test_bf16_engine_runs_interleaved_and_matches_the_packed_rows_path(scheme, tmp_path_factory, monkeypatch):
    dense = tiny_dense_model(tmp_path_factory.mktemp("dense"))
    path = tmp_path_factory.mktemp("q") / scheme.name
    write_checkpoint(dense, path, scheme)
    batch = prompts(lengths=(1, 9, 17, 40), seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    llm = LLM(str(path), dtype="bfloat16", device="cpu", max_num_batched_tokens=32)
    layers = [m for m in llm.llm_engine.runner.model.modules() if isinstance(m, QuantizedLinear)]
    assert len(layers) == 2 * 4 and all(m.all_interleaved for m in layers)
    if not scheme.desc_act:  # q/k/v and gate/up joined (act-order: each its own input order here)
        assert all(len(m.parts) == 1 for m in layers)
    if cpu_kernels.gemm_bf16_enabled():  # the dense lm_head on gemm_bf16: decode steps are captured
        assert llm.llm_engine.runner.decode_graph is not None
    outs = [o.outputs[0].token_ids for o in llm.generate(batch, params)]
    assert_engine_clean(llm)
    eager = LLM(str(path), dtype="bfloat16", device="cpu", max_num_batched_tokens=32, enforce_eager=True)
    assert [o.outputs[0].token_ids for o in eager.generate(batch, params)] == outs  # the modules' tokens
    monkeypatch.setenv("PLAYGROUND_INTERLEAVED_PACKED", "0")
    rows = LLM(str(path), dtype="bfloat16", device="cpu", max_num_batched_tokens=32)
    row_layers = [m for m in rows.llm_engine.runner.model.modules() if isinstance(m, QuantizedLinear)]
    assert not any(isinstance(p, Interleaved) for m in row_layers for p in m.parts)  # packed_rows' layout
    assert rows.stats().weights_bytes == llm.stats().weights_bytes  # the same bytes, moved
    assert [o.outputs[0].token_ids for o in rows.generate(batch, params)] == outs
