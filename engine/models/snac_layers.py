"""The layers of SNAC's decoder (engine/models/snac.py): Snake, the residual unit, the noise
block and the decoder block, each with the torch reference and its Triton kernels.

Kernels (`engine.codec_kernels`, CODEC_KERNELS): on CUDA tensors the Snakes can run as one
Triton kernel each (`snake`), and each residual unit's Snake -> depthwise conv -> Snake as one
(`fused`; engine/kernels/triton_snac.py, docs/KERNELS.md); `folded` is `fused` with each
residual unit's 1x1 conv one GEMM that adds its product into the unit's input in place (the
residual add as the GEMM's accumulator) and leaves its bias out, handed on as a per-channel
shift that the next kernel to read the activations adds (the next unit's, or the next Snake's;
the shifts of a block's units add up). `folded_noise` is `folded` with each block's noise block
folded too: its transposed conv runs without its bias, which becomes the block's first shift,
and the noise block, x + noise * W x on x + shift, is one kernel making (x + shift) * noise and
one GEMM adding W times that into x in place (the noise is one value a step, so it commutes
with the 1x1 conv). The torch expressions here are the reference and what a CPU runs whatever
the setting.
"""

from __future__ import annotations

import math

import torch
from torch import nn

FOLDED = ("folded", "folded_noise")  # engine.codec_kernels that fold the 1x1 convs


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """x + sin^2(alpha x) / alpha, per channel (alpha [1, C, 1]): the reference, op by op."""
    return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


def _triton_snac():
    """engine/kernels/triton_snac.py, imported when first used: it imports triton, which only
    CUDA machines have."""
    from engine.kernels import triton_snac

    return triton_snac


class Snake1d(nn.Module):
    """x + sin^2(alpha x) / alpha, per channel; on CUDA one Triton kernel unless `kernels` is
    "torch"."""

    def __init__(self, channels: int, kernels: str = "torch", sine: str = "exact"):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))
        self.triton = kernels != "torch"
        self.approx = sine == "approx"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.triton and x.is_cuda:
            return _triton_snac().snake(x, self.alpha, approx=self.approx)
        return snake(x, self.alpha)


class ResidualUnit(nn.Module):
    """x + conv1x1(snake(dwconv(snake(x)))); with `kernels` "fused" (and a depthwise conv), on
    CUDA the part before the 1x1 conv is one Triton kernel."""

    def __init__(
        self, dim: int, dilation: int, groups: int, kernels: str = "torch", sine: str = "exact"
    ):
        super().__init__()
        size = 7
        pad = (size - 1) * dilation // 2
        self.block = nn.Sequential(
            Snake1d(dim, kernels, sine),
            nn.Conv1d(dim, dim, size, dilation=dilation, padding=pad, groups=groups),
            Snake1d(dim, kernels, sine),
            nn.Conv1d(dim, dim, 1),
        )
        self.fused = kernels in ("fused", *FOLDED) and groups == dim
        self.approx = sine == "approx"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and x.is_cuda:
            return x + self.block[3](self._snake_conv(x))
        return x + self.block(x)

    def _snake_conv(self, x: torch.Tensor, shift: torch.Tensor | None = None) -> torch.Tensor:
        """The unit's Snake -> depthwise conv -> Snake on `x + shift`: one Triton kernel."""
        snake1, conv, snake2, _ = self.block
        weights = (snake1.alpha, conv.weight, conv.bias, snake2.alpha, conv.dilation[0])
        return _triton_snac().residual_snake_conv(x, *weights, shift, approx=self.approx)

    def folded(
        self, x: torch.Tensor, shift: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The unit on `x + shift` (shift [C] fp32, or None: 0), as `engine.codec_kernels:
        folded` runs it: x + shift + pointwise(y) is returned as x, updated in place by one
        batched GEMM (x += W y), and the shift to add to it, shift + the 1x1 conv's bias. The
        caller owns x: no one else may hold it."""
        pointwise = self.block[3]
        y = self._snake_conv(x, shift)
        x.baddbmm_(pointwise.weight[..., 0].expand(x.shape[0], -1, -1), y)
        bias = pointwise.bias.float()
        return x, bias if shift is None else shift + bias


class NoiseBlock(nn.Module):
    """x + noise * linear(x), the noise [1, 1, steps] drawn once (reset_noise), not per call."""

    def __init__(self, dim: int, steps: int):
        super().__init__()
        self.linear = nn.Conv1d(dim, dim, 1, bias=False)
        self.register_buffer("noise", torch.zeros(1, 1, steps), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.noise * self.linear(x)

    def folded(
        self, x: torch.Tensor, shift: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The block on `x + shift` (shift [C] fp32, or None: 0), as `engine.codec_kernels:
        folded_noise` runs it: noise * linear(x + shift) = linear((x + shift) * noise), the
        noise being one value a step, so x += W ((x + shift) * noise), one Triton kernel and one
        batched GEMM adding into x in place; the shift is still x's to add, returned as it
        came. The caller owns x."""
        y = _triton_snac().shift_scale(x, shift, self.noise)
        x.baddbmm_(self.linear.weight[..., 0].expand(x.shape[0], -1, -1), y)
        return x, shift


def _transposed_conv(conv: nn.ConvTranspose1d, x: torch.Tensor) -> torch.Tensor:
    """`conv` on x without its bias (a fresh tensor)."""
    return torch.nn.functional.conv_transpose1d(
        x, conv.weight, None, conv.stride, conv.padding, conv.output_padding, conv.groups,
        conv.dilation,
    )  # fmt: skip


class DecoderBlock(nn.Module):
    def __init__(
        self, in_dim: int, out_dim: int, stride: int, noise_steps: int | None, groups: int,
        kernels: str, sine: str = "exact",
    ):  # fmt: skip
        super().__init__()
        self.fold_noise = kernels == "folded_noise" and noise_steps is not None
        layers: list[nn.Module] = [
            Snake1d(in_dim, kernels, sine),
            nn.ConvTranspose1d(
                in_dim, out_dim, 2 * stride, stride=stride,
                padding=math.ceil(stride / 2), output_padding=stride % 2,
            ),
        ]  # fmt: skip
        if noise_steps is not None:
            layers.append(NoiseBlock(out_dim, noise_steps))
        layers += [ResidualUnit(out_dim, d, groups, kernels, sine) for d in (1, 3, 9)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)

    def folded(
        self, x: torch.Tensor, shift: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The block on `x + shift` (the last block's units' biases, per channel; None: 0), its
        units folded (ResidualUnit.folded), and with `folded_noise` its noise block too
        (NoiseBlock.folded), the transposed conv's bias then handed on with the units':
        returns x and the shift still to add to it."""
        snake, upsample, *rest = self.block
        x = _triton_snac().snake(x, snake.alpha, shift, approx=snake.approx)
        if self.fold_noise:  # the upsampled x without its bias, which becomes the shift
            x, shift = _transposed_conv(upsample, x), upsample.bias.float()
        else:
            x, shift = upsample(x), None
        for layer in rest:
            if isinstance(layer, ResidualUnit) or self.fold_noise:
                x, shift = layer.folded(x, shift)
            else:  # the noise block, before the units
                if shift is not None:
                    raise AssertionError("a layer after a folded unit cannot take its shift")
                x = layer(x)
        return x, shift
