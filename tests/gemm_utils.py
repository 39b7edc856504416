"""Checks for the native GEMMs (csrc/gemm_bf16.cpp, csrc/interleaved.cpp), shared by their tests and
subprocesses."""

from __future__ import annotations

import torch


def within_rounding(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> bool:
    """out (bf16) is the exact x @ weight^T + bias up to fp32 summation error and one bf16 rounding."""
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    bound = 1e-5 * (x.double().abs() @ weight.double().abs().T) + exact.abs() * 2.0**-8 + 1e-6
    return bool(((out.double() - exact).abs() <= bound).all())


def within_summation_error(out, x, weight, bias) -> bool:  # [rows, n], [rows, k], [n, k], [n]
    """out (bf16) within fp32 summation error of the exact x @ weight^T + bias, plus bf16's rounding."""
    exact = x.double() @ weight.double().T + bias.double()
    bound = 1e-5 * (x.abs().double() @ weight.abs().double().T) + 1e-6 * bias.double().abs() + 1e-6
    bound += exact.abs() * 2.0**-8
    return bool(((out.double() - exact).abs() <= bound).all())
