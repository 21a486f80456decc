"""Partial rotary position embedding (neox style: rotate the two halves of the rotary part).

Only the first `rotary_dim` dims of each head rotate; the rest pass through. Qwen3.5's text
positions are the same on its three M-RoPE axes, so M-RoPE reduces to this plain form.
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, rotary_dim: int, theta: float):
        super().__init__()
        if rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
        self.rotary_dim = rotary_dim
        self.theta = theta
        self.table: tuple[torch.Tensor, torch.Tensor] | None = None  # `tabulate`'s

    def tabulate(self, positions: int, device: torch.device) -> None:
        """cos and sin of every position below `positions` computed once, on `device`: a
        step's then gathered (two kernels where computing them takes eight), the same values
        (each element by the same elementwise ops). The engine's, on CUDA, to its
        max_model_len; not a buffer, so a model built on the meta device needs none. It only
        grows: engines that share a model each keep every position they were promised."""
        device, held = torch.device(device), self.table[0] if self.table else None
        same = held is not None and held.device.type == device.type
        if same and device.index in (None, held.device.index):  # "cuda": the current one
            positions = max(positions, held.shape[0])
            if positions == held.shape[0]:
                return
        self.table = self.angles(torch.arange(positions, device=device))

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> (cos, sin), each [T, rotary_dim // 2] in fp32: gathered from the
        table on its device (every position below its length), else computed."""
        if self.table is not None and self.table[0].device == positions.device:
            cos, sin = self.table
            return cos[positions], sin[positions]
        return self.angles(positions)

    def angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of positions [T], computed: the frequencies, the angles, then both."""
        exponents = torch.arange(
            0, self.rotary_dim, 2, device=positions.device, dtype=torch.float32
        )
        inv_freq = self.theta ** (-exponents / self.rotary_dim)
        angles = positions.float()[:, None] * inv_freq[None, :]
        return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; cos/sin [T, rotary_dim // 2]. Rotates in fp32, returns x's dtype."""
    rotary_dim = 2 * cos.shape[-1]
    rot, rest = x[..., :rotary_dim].float(), x[..., rotary_dim:]
    x1, x2 = rot.chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((rotated.to(x.dtype), rest), dim=-1)
