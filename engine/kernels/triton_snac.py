"""Triton kernels for the SNAC codec's elementwise work (engine/models/snac.py).

The codec's convolutions are few FLOPs; its cost on a GPU is the traffic of elementwise ops
over large activations (24 kHz: 1024 channels x 16 steps to 64 x 8192 a window). In torch a
Snake, x + sin(alpha x)^2 / alpha, is five kernels over its tensor, each reading and writing
it. Here:

- `snake`: one pass, read once, written once.
- `residual_snake_conv`: a residual unit's Snake -> depthwise conv (k = 7, dilation d, zero
  padding, bias) -> Snake in one pass: each output reads its 7 taps of x, applies the first
  Snake to each (recomputed per tap: 8 sines an output, which bound the kernel on the H200
  with libdevice's sinf; `engine.codec_sine: approx` makes each one SFU instruction), sums
  them with the channel's weights and bias and applies the second Snake. The unit's 1x1 conv
  and its residual add stay torch (a GEMM; with `folded`, one adding into x in place).
- `shift_scale`: (x + bias) * noise, a folded noise block's input to its 1x1 conv
  (`engine.codec_kernels: folded_noise`).

All can add a per-channel bias to x as they read it (`bias_in`, fp32 math): with
`engine.codec_kernels: folded` the residual units leave their 1x1 convs' biases out of the
activations and hand them on to the next kernel that reads them (engine/models/snac.py); with
`folded_noise` the transposed convs' biases too, through the noise blocks.

All take [B, C, T] activations (made contiguous: the codec's are) and per-channel parameters,
compute in fp32 and round once, to the activations' dtype, on the store (the bf16 reference
rounds after every op, so in bf16 these are closer to the fp32 model than the reference is).
Every program works within one (batch row, channel) row, so a batch decodes each row as it
would alone (INVARIANTS 41). The 1e-9 is the reference's: alpha = 0 stays finite.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from engine.kernels.triton_launch import bound

# Time steps a program covers (4 warps): the Snake's 8 a thread, 37 registers on sm_90; the
# fused unit's 2 a thread, 54 registers (4 a thread: 105; 8: 168 and spills, its 7 sines each).
SNAKE_BLOCK = 1024
UNIT_BLOCK = 256


@triton.jit
def _snake(x, alpha, inv_alpha, APPROX: tl.constexpr):
    if APPROX:  # the SFU's sin.approx.f32: one instruction
        s = libdevice.fast_sinf(alpha * x)
    else:  # libdevice's sinf: ~40 instructions and, for huge arguments, a local-memory path
        s = tl.sin(alpha * x)
    return x + inv_alpha * (s * s)


@triton.jit
def _shifted_block(X, BIAS_IN, C, T, BLOCK: tl.constexpr):
    """This program's block of its row (program 0: batch row * C + channel; 1: the block of
    steps): x + bias_in in fp32 (bias_in None: x), its steps, their mask and offsets."""
    row = tl.program_id(0)
    t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = t < T
    offsets = row.to(tl.int64) * T + t
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    if BIAS_IN is not None:
        x += tl.load(BIAS_IN + row % C).to(tl.float32)
    return x, t, mask, offsets


@bound
@triton.jit
def _snake_kernel(X, OUT, ALPHA, BIAS_IN, C, T, BLOCK: tl.constexpr, APPROX: tl.constexpr):
    x, _, mask, offsets = _shifted_block(X, BIAS_IN, C, T, BLOCK)
    alpha = tl.load(ALPHA + tl.program_id(0) % C).to(tl.float32)
    y = _snake(x, alpha, 1.0 / (alpha + 1e-9), APPROX)
    tl.store(OUT + offsets, y.to(OUT.dtype.element_ty), mask=mask)


@bound
@triton.jit
def _residual_snake_conv_kernel(
    X, OUT, ALPHA1, W, BIAS, ALPHA2, BIAS_IN, C, T,
    DILATION: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr, APPROX: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    channel = row % C
    t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    base = row.to(tl.int64) * T
    alpha1 = tl.load(ALPHA1 + channel).to(tl.float32)
    inv1 = 1.0 / (alpha1 + 1e-9)
    shift = 0.0
    if BIAS_IN is not None:
        shift = tl.load(BIAS_IN + channel).to(tl.float32)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(K):  # tap j reads x[t + (j - K // 2) * dilation]
        src = t + (j - K // 2) * DILATION
        inside = (src >= 0) & (src < T)
        x = tl.load(X + base + src, mask=inside, other=0.0).to(tl.float32) + shift
        # zero padding of the conv's input
        y = tl.where(inside, _snake(x, alpha1, inv1, APPROX), 0.0)
        acc += tl.load(W + channel * K + j).to(tl.float32) * y
    acc += tl.load(BIAS + channel).to(tl.float32)
    alpha2 = tl.load(ALPHA2 + channel).to(tl.float32)
    out = _snake(acc, alpha2, 1.0 / (alpha2 + 1e-9), APPROX)
    tl.store(OUT + base + t, out.to(OUT.dtype.element_ty), mask=t < T)


@bound
@triton.jit
def _shift_scale_kernel(X, OUT, BIAS_IN, NOISE, C, T, BLOCK: tl.constexpr):
    x, t, mask, offsets = _shifted_block(X, BIAS_IN, C, T, BLOCK)
    y = x * tl.load(NOISE + t, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + offsets, y.to(OUT.dtype.element_ty), mask=mask)


def _grid(x: torch.Tensor, most: int) -> tuple[tuple[int, int], int]:
    """A program per (batch row, channel) and block of time steps; the block is `most` steps
    or the row's length, rounded up to a power of 2."""
    batch, channels, steps = x.shape
    block = min(most, triton.next_power_of_2(steps))
    return (batch * channels, triton.cdiv(steps, block)), block


def snake(
    x: torch.Tensor, alpha: torch.Tensor, bias_in: torch.Tensor | None = None,
    approx: bool = False,
) -> torch.Tensor:  # fmt: skip
    """x + sin(alpha x)^2 / (alpha + 1e-9) per channel: x [B, C, T], alpha [1, C, 1]
    (Snake1d's parameter); of x + bias_in (per channel, [C]) where given; `approx`: the
    hardware's sine (`_snake`). Returns a new [B, C, T] in x's dtype."""
    x = x.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        grid, block = _grid(x, SNAKE_BLOCK)
        _snake_kernel[grid](
            x, out, alpha, bias_in, x.shape[1], x.shape[2], BLOCK=block, APPROX=approx
        )  # fmt: skip
    return out


def residual_snake_conv(
    x: torch.Tensor,
    alpha1: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    alpha2: torch.Tensor,
    dilation: int,
    bias_in: torch.Tensor | None = None,
    approx: bool = False,
) -> torch.Tensor:
    """snake2(depthwise_conv(snake1(x))): x [B, C, T]; alpha1, alpha2 [1, C, 1];
    the conv's weight [C, 1, K] (K odd, groups = C, padding (K - 1) / 2 x dilation: the length
    kept) and bias [C]; of x + bias_in (per channel, [C]; the conv's zero padding stays zero)
    where given; `approx`: the hardware's sine. Returns a new [B, C, T] in x's dtype."""
    x = x.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        grid, block = _grid(x, UNIT_BLOCK)
        _residual_snake_conv_kernel[grid](
            x, out, alpha1, weight, bias, alpha2, bias_in, x.shape[1], x.shape[2],
            DILATION=dilation, K=weight.shape[-1], BLOCK=block, APPROX=approx,
        )  # fmt: skip
    return out


def shift_scale(x: torch.Tensor, bias_in: torch.Tensor | None, noise: torch.Tensor) -> torch.Tensor:
    """(x + bias_in) * noise: x [B, C, T], bias_in per channel ([C], fp32; None: 0), noise
    per step ([1, 1, T] or [T], a noise block's drawn noise): a folded noise block's input to
    its 1x1 conv (engine.codec_kernels folded_noise). Returns a new [B, C, T] in x's dtype."""
    x = x.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        grid, block = _grid(x, SNAKE_BLOCK)
        _shift_scale_kernel[grid](
            x, out, bias_in, noise.reshape(-1), x.shape[1], x.shape[2], BLOCK=block
        )  # fmt: skip
    return out
