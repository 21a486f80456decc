"""RMS norms: the zero-centred one of Qwen3.5's residual stream and the gated one of DeltaNet.

Both normalise in fp32 whatever the model dtype: the mean of squares over a 1024-wide row
loses too much in bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * weight over the last dim, computed in fp32, returned in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


class RMSNorm(nn.Module):
    """Scales by (1 + weight): the weight is stored zero-centred, so zeros is the identity scale."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch_rms_norm(x, 1.0 + self.weight.float(), self.eps)


class GatedRMSNorm(nn.Module):
    """norm(x) * weight * silu(z), per head: the output norm of a Gated DeltaNet layer.

    Unlike `RMSNorm` the weight is a plain scale (ones is the identity), as in the published
    checkpoints.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        normed = torch_rms_norm(x.float(), self.weight, self.eps)
        return (normed * F.silu(z.float())).to(x.dtype)
