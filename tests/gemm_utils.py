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


def int8_error_bound(x: torch.Tensor, weight: torch.Tensor, block: int) -> torch.Tensor:  # [rows, k], [n, k]
    """[rows, n]: how far x @ weight^T can move when each block of x's rows is rounded to int8 as
    csrc/int8_dot.h rounds it (d = max |x| / 127, q = round(x / d)): |x - d q| <= d / 2 per value, so
    sum over blocks of d / 2 * sum |w| (times 1 + 2^-10: the fp32 rounding of x / d and of d)."""
    rows, k = x.shape
    d = x.double().abs().view(rows, k // block, block).amax(-1) / 127  # [rows, blocks]
    weight_sums = weight.double().abs().view(weight.shape[0], k // block, block).sum(-1)  # [n, blocks]
    return (d / 2 * (1 + 2.0**-10)) @ weight_sums.T


def within_int8_error(out, x, weight, bias, block: int) -> bool:  # [rows, n], [rows, k], [n, k], [n] or None
    """out (bf16) within int8_error_bound of the exact x @ weight^T + bias, plus fp32 summation error and
    bf16's rounding: what the int8-activation kernels (csrc/int8_dot.h) promise."""
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    int8 = int8_error_bound(x, weight, block)
    bound = int8 + 1e-5 * (x.abs().double() @ weight.abs().double().T) + 1e-6
    bound += (exact.abs() + int8) * 2.0**-8
    return bool(((out.double() - exact).abs() <= bound).all())
