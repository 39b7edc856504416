"""RMSNorm, with the decoder's residual add fused into it (add_forward): vLLM's fused_add_rms_norm."""

from __future__ import annotations

import torch
from torch import nn

from backend.engine import cpu_kernels


class RMSNorm(nn.Module):
    use_kernel = False  # set by CausalLM.prepare_weights when cpu_kernels serve this model

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_kernel and x.is_contiguous():
            return cpu_kernels.rms_norm(x.view(-1, x.shape[-1]), self.weight, self.eps).view(x.shape)
        # as transformers does: normalise in fp32, scale in the model dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the decoder's residual add fused with the next norm."""
        if self.use_kernel and x.is_contiguous() and residual.is_contiguous():
            return cpu_kernels.add_rms_norm(x, residual, self.weight, self.eps)
        residual = x + residual
        return self(residual), residual
