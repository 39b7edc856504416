"""The native dense bf16 GEMM (csrc/gemm_bf16.cpp) against the exact product for every tile shape it has
(1-6 rows x 1-4 panels, blocks of rows, columns past a panel's end, bias), on one and two threads; its
SiLU-and-multiply epilogue against the separate kernels, bit for bit; the engine's choice of it by CPU
features; each instruction-set build keeping oneDNN where the kernel is not built; and a bf16 engine on it
(MLPs fused) against the same engine on oneDNN, greedy, token by token."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from backend.cpu_features import cpu_features
from backend.engine import LLM, SamplingParams, cpu_kernels
from backend.engine.layers.linear import Linear
from backend.engine.layers.mlp import GatedMLP
from tests.common_utils import ROOT
from tests.engine_utils import assert_engine_clean, count_identical_within_top5, prompts, tiny_model
from tests.gemm_utils import within_rounding

CPU = cpu_features()  # the flags that decide which instruction-set builds run here

needs_gemm = pytest.mark.skipif(
    not cpu_kernels.gemm_bf16_enabled(),
    reason="the kernels' build lacks AVX512_BF16 (or AMX tiles on a CPU with AMX)",
)


@needs_gemm
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(16, 2), (200, 96), (49, 1536), (960, 576)])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 23, 64, 130, 263])
def test_gemm_within_rounding_of_the_exact_product(rows, n, k, threads):
    gen = torch.Generator().manual_seed(rows * 1000 + n)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    weight = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if rows % 2 else None
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = cpu_kernels.gemm_bf16(x, cpu_kernels.gemm_bf16_pack(weight), n, bias)
    finally:
        torch.set_num_threads(previous)
    assert out.shape == (rows, n) and out.dtype == torch.bfloat16
    assert within_rounding(out, x, weight, bias)
    # the same product as torch's fp32 one rounded once to bf16, but for a few near-ties
    assert (
        out != F.linear(x.float(), weight.float(), None if bias is None else bias.float()).bfloat16()
    ).float().mean() < 0.02


@needs_gemm
def test_gemm_writes_only_its_columns_and_is_the_same_on_any_thread_count():
    gen = torch.Generator().manual_seed(1)
    rows, n, k, ldy = 20, 37, 64, 50  # a last panel of 5 columns; the row stride leaves 13 columns alone
    x = torch.randn(rows, k, generator=gen).bfloat16()
    weight = torch.randn(n, k, generator=gen).bfloat16()
    packed = cpu_kernels.gemm_bf16_pack(weight)
    assert packed.shape == (3, k // 2, 16, 2) and not packed.view(-1, 16, 2)[-k // 2 :, 5:].any()
    library = cpu_kernels.load_library()
    outs = []
    for threads in (1, 2):
        out = torch.full((rows + 1, ldy), float("nan"), dtype=torch.bfloat16)
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            library.gemm_bf16(x.data_ptr(), packed.data_ptr(), None, out.data_ptr(), rows, n, k, ldy, 0)
        finally:
            torch.set_num_threads(previous)
        assert out[:rows, n:].isnan().all() and out[rows:].isnan().all()
        outs.append(out[:rows, :n])
    assert within_rounding(outs[0], x, weight, None)
    assert torch.equal(outs[0], outs[1])  # each sum is one thread's, in the same order
    widened = torch.full((rows, ldy), float("nan"))
    library.gemm_bf16(x.data_ptr(), packed.data_ptr(), None, widened.data_ptr(), rows, n, k, ldy, 1)
    assert torch.equal(widened[:, :n], outs[0].float()) and widened[:, n:].isnan().all()


@needs_gemm
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("intermediate", "k", "has_bias"), [(16, 64, True), (48, 96, False), (1536, 576, True)]
)
@pytest.mark.parametrize("rows", [1, 5, 64, 131])
def test_fused_silu_and_mul_equals_the_gemm_then_silu_and_mul(rows, intermediate, k, has_bias, threads):
    """gemm_bf16_silu_and_mul on pack_gate_up's layout rounds as gemm_bf16 followed by silu_and_mul, and
    the pair is transformers' F.silu(gate) * up of the bf16 projection."""
    gen = torch.Generator().manual_seed(rows + intermediate)
    n = 2 * intermediate
    x = torch.randn(rows, k, generator=gen).bfloat16()
    weight = (torch.randn(n, k, generator=gen) / k**0.5).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if has_bias else None
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gate_up = cpu_kernels.gemm_bf16(x, cpu_kernels.gemm_bf16_pack(weight), n, bias)
        separate = cpu_kernels.silu_and_mul(gate_up)
        packed, packed_bias = cpu_kernels.pack_gate_up(weight, bias)
        fused = cpu_kernels.gemm_bf16_silu_and_mul(x, packed, n, packed_bias)
    finally:
        torch.set_num_threads(previous)
    assert fused.shape == (rows, intermediate) and torch.equal(fused, separate)
    gate, up = gate_up.split(intermediate, dim=-1)
    reference = F.silu(gate) * up
    assert ((fused.float() - reference.float()).abs() <= reference.float().abs() * 2.0**-7 + 1e-6).all()


def test_amx_cpus_take_it_with_amx_tiles_and_the_switch_keeps_onednn(monkeypatch):
    """PLAYGROUND_GEMM_BF16=0 keeps oneDNN; a CPU with AMX takes gemm_bf16 only with its AMX tiles for many
    rows (csrc/gemm_amx.h: built for AMX, the tile state granted), else oneDNN's AMX GEMM, which prefills
    faster than VDPBF16PS; a CPU without AMX takes it wherever it is built."""
    built = cpu_kernels.gemm_bf16_enabled()
    monkeypatch.setenv("PLAYGROUND_GEMM_BF16", "0")
    assert not cpu_kernels.gemm_bf16_enabled()
    monkeypatch.delenv("PLAYGROUND_GEMM_BF16")
    flags = cpu_kernels._cpu_id()
    monkeypatch.setattr(cpu_kernels, "_cpu_id", lambda: f"{flags} amx_bf16 amx_tile")
    assert cpu_kernels.gemm_bf16_enabled() == (built and cpu_kernels.gemm_amx_min_rows() > 0)
    monkeypatch.setenv("PLAYGROUND_GEMM_AMX_MIN_ROWS", "0")  # the tiles turned off: oneDNN again
    assert not cpu_kernels.gemm_bf16_enabled()
    monkeypatch.delenv("PLAYGROUND_GEMM_AMX_MIN_ROWS")
    monkeypatch.setattr(cpu_kernels, "_cpu_id", lambda: flags.replace(" amx_bf16", ""))
    assert cpu_kernels.gemm_bf16_enabled() == cpu_kernels._gemm_bf16_built()


CHECK_BUILD = """
import torch
from backend.engine import cpu_kernels
from backend.engine.layers.linear import Linear
from tests.gemm_utils import within_rounding

torch.manual_seed(0)
layer = Linear(96, 40, bias=True).bfloat16()
weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
layer.prepare()
x = torch.randn(9, 96).bfloat16()
assert within_rounding(layer(x), x, weight, bias)
print(cpu_kernels.build_flags())
print("gemm_bf16", layer.native_weight is not None)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "march",
    [
        "haswell",
        "x86-64",
        pytest.param(
            "skylake-avx512",
            marks=pytest.mark.skipif(not CPU.has("avx512bw"), reason="no AVX-512"),
        ),
        pytest.param(
            "cooperlake",
            marks=pytest.mark.skipif(not CPU.has_avx512_bf16, reason="no AVX512_BF16"),
        ),
        pytest.param("sapphirerapids", marks=pytest.mark.skipif(not CPU.has_amx_bf16, reason="no AMX")),
    ],
)
def test_each_instruction_set_build_picks_its_gemm(march):
    """A build with AVX512_BF16 serves Linear with gemm_bf16 on a CPU without AMX, and on a CPU with AMX
    only a build with AMX tiles does; every other keeps oneDNN's packed GEMM, and both compute the product
    within bf16 rounding."""
    env = os.environ | {"PLAYGROUND_CPU_KERNELS_MARCH": march, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", CHECK_BUILD], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    native = march == "sapphirerapids" or (march == "cooperlake" and not CPU.has_amx_bf16)
    assert f"gemm_bf16 {native}" in result.stdout
    assert ("AMX tiles" in result.stdout) == (march == "sapphirerapids")


@needs_gemm
@pytest.mark.usefixtures("one_torch_thread")
def test_bf16_engine_on_the_native_gemm_agrees_with_onednn(monkeypatch):
    """bf16 rounds every layer's output, so another order of the fp32 sums moves a few values by a unit in
    the last place; the tiny random model's greedy choices are close calls: most continuations stay
    identical, and where one first differs each side's token is among the other's top 5."""
    path = tiny_model("llama")[0]
    batch = prompts()

    def run(native: bool):
        monkeypatch.setenv("PLAYGROUND_GEMM_BF16", "1" if native else "0")
        llm = LLM(path, dtype="bfloat16", device="cpu", max_num_seqs=len(batch))
        layers = [m for m in llm.llm_engine.runner.model.modules() if isinstance(m, Linear)]
        assert all((m.native_weight is not None) is native for m in layers) and layers
        mlps = [m for m in llm.llm_engine.runner.model.modules() if isinstance(m, GatedMLP)]
        assert all(m.fused_silu_and_mul is native for m in mlps) and mlps
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=5)
        outs = [out.outputs[0] for out in llm.generate(batch, params)]
        assert_engine_clean(llm)
        return outs

    ours, onednn = run(True), run(False)
    assert count_identical_within_top5(ours, onednn) >= len(batch) * 2 // 3
