"""Checks for the dense bf16 GEMM (csrc/gemm_bf16.cpp), shared by its tests and their subprocesses."""

from __future__ import annotations

import torch


def within_rounding(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> bool:
    """out (bf16) is the exact x @ weight^T + bias up to fp32 summation error and one bf16 rounding."""
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    bound = 1e-5 * (x.double().abs() @ weight.double().abs().T) + exact.abs() * 2.0**-8 + 1e-6
    return bool(((out.double() - exact).abs() <= bound).all())
