"""Linear on each of the layouts prepare() can pick (oneDNN fp32, oneDNN bf16, an fp32 copy of bf16
weights on CPUs without bf16 units, the native bf16 GEMM) gives nn.Linear's result."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backend.engine import cpu_kernels
from backend.engine.layers import linear
from backend.engine.layers.linear import Linear
from tests.gemm_utils import within_rounding

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def prepared(dtype: torch.dtype, seed: int) -> tuple[Linear, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    layer = Linear(96, 40, bias=True).to(dtype)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    layer.prepare()
    return layer, weight, bias


@pytest.mark.parametrize("rows", [1, 9])
@pytest.mark.parametrize("layout", ["onednn_fp32", "onednn_bf16", "fp32_copy_of_bf16", "native_bf16"])
def test_every_prepared_layout_matches_linear(layout, rows, monkeypatch):
    if layout != "native_bf16":
        monkeypatch.setenv("PLAYGROUND_GEMM_BF16", "0")
    elif not cpu_kernels.gemm_bf16_enabled():
        pytest.skip("this build or CPU does not serve Linear with gemm_bf16")
    if layout == "fp32_copy_of_bf16":
        monkeypatch.setattr(linear, "cpu_has_fast_bf16", lambda: False)
    dtype = torch.float32 if layout == "onednn_fp32" else torch.bfloat16
    layer, weight, bias = prepared(dtype, seed=rows)
    assert (layer.native_weight is not None) == (layout == "native_bf16")
    assert (layer.packed_weight is not None) == (layout != "native_bf16")
    x = torch.randn(rows, 96).to(dtype)
    out = layer(x)
    assert out.dtype == dtype and out.shape == (rows, 40)
    if dtype == torch.float32:
        torch.testing.assert_close(out, F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
    else:
        assert within_rounding(out, x, weight, bias)
