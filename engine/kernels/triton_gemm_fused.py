"""What the dense GEMM (triton_gemm.py) fuses in: its epilogues, its prologues and, under PDL,
its weight prefetch (`engine.dense_epilogues`, docs/KERNELS.md). Each rounds where the unfused
kernels round, so turning the setting on changes launches, never bits (INVARIANTS 89).

- `_silu_mul`: the MLP's [gate; up] GEMM stores silu(gate) * up.
- `_conv_epilogue`: a decode step's Gated DeltaNet in-projection stores, for its conv
  channels, the causal conv + SiLU of the rounded product and shifts each row's conv window
  (triton_gdn_conv.conv_decode_step, the decode conv kernel's own arithmetic); its z, b and a
  columns as they are.
- `Partials`: a split product's fp32 partials handed to the norm that sums them.
- Prologues, on each K tile of x as it is loaded: `GatedNorm` (Gated DeltaNet's output: the
  out-projection reads norm(core) * silu(z) per head, `gated_norm_rows`, the arithmetic of
  triton_norms.gated_norm) and `SigmoidGate` (gated attention's output: o_proj reads
  out * sigmoid(gate), `sigmoid_gate_rows`, triton_norms.sigmoid_gate's).
- `_prefetch_l2`: the weight's first lines asked of L2 before the PDL wait.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from engine.kernels.triton_gdn_conv import conv_decode_step


class Partials(NamedTuple):
    """A split GEMM's fp32 partial products [split, M, N], not yet summed (`skinny_linear`'s
    `partials=True`): for a reader that sums them itself (triton_norms.rms_norm), which saves
    the sum's launch and its rounded [M, N] round trip."""

    sums: torch.Tensor
    dtype: torch.dtype  # the product's, once summed and rounded


class GatedNorm(NamedTuple):
    """x (the recurrence's output [M, heads x dim]) read by the GEMM as norm(x) * weight *
    silu(z), per head of `dim` columns (`skinny_linear(prologue=...)`; only where
    `gemm_config.fuses_prologue`: a K tile is one head)."""

    z: torch.Tensor  # [M, heads x dim], rows may be strided
    weight: torch.Tensor  # [dim] fp32
    eps: float


class SigmoidGate(NamedTuple):
    """x (attention's output [M, K]) read by the GEMM as x * sigmoid(gate)."""

    gate: torch.Tensor  # [M, K], rows may be strided


class ConvEpilogue(NamedTuple):
    """A decode step's causal conv fused into its in-projection (`skinny_linear(conv=...)`):
    the product's first `channels` columns are the conv's input, one token a row."""

    weight: torch.Tensor  # [channels, K] taps
    state: torch.Tensor  # [slots, channels, K - 1] windows, updated in place
    slots: torch.Tensor  # [rows] int32: each row's window
    cached: torch.Tensor  # [rows] int32: > 0 where the row's window holds its inputs
    channels: int


@triton.jit
def _silu_mul(gate, up, DTYPE: tl.constexpr):
    """silu(gate) * up in DTYPE from fp32 sums, rounded where the unfused pair rounds: each
    product to DTYPE (the GEMM's output), silu to DTYPE, the product once
    (triton_norms._silu_mul_kernel)."""
    gate = gate.to(DTYPE).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(DTYPE).to(tl.float32)
    return (act * up.to(DTYPE).to(tl.float32)).to(DTYPE)


@triton.jit
def gated_norm_rows(x, z, w, dim, eps, DTYPE: tl.constexpr):
    """norm(x) * w * silu(z) in DTYPE of rows x, z [R, B] (fp32 widened from DTYPE, zeros past
    `dim`), w [B] fp32: one head a row. The sum of squares in fp64, where a 16-bit value's
    square is exact and so is their sum (up to terms 2^-30 below it, which can move the fp32
    sum only within 2^-53 of a rounding boundary): the same bits in every kernel, whatever
    order its layout sums in (the standalone norm's, the GEMM prologue's)."""
    x64 = x.to(tl.float64)
    inv = 1.0 / tl.sqrt(tl.sum(x64 * x64, axis=1).to(tl.float32) / dim + eps)
    normed = x * inv[:, None] * w[None, :]
    return (normed * (z / (1.0 + tl.exp(-z)))).to(DTYPE)


@triton.jit
def sigmoid_gate_rows(x, gate, DTYPE: tl.constexpr):
    """x * sigmoid(gate) in DTYPE from fp32 values widened from DTYPE, rounded where the torch
    reference rounds: the sigmoid to DTYPE, then the product."""
    sig = (1.0 / (1.0 + tl.exp(-gate))).to(DTYPE).to(tl.float32)
    return (x * sig).to(DTYPE)


@triton.jit
def _prologue(x, OTHER, NORM_W, ks, mask, eps, KIND: tl.constexpr, DIM: tl.constexpr):
    """A K tile x [BLOCK_M, DIM] of the GEMM's input as the GEMM reads it: KIND 1 the gated
    norm (OTHER: z's tile, NORM_W the norm's weight; the tile is one head), 2 the sigmoid
    gate (OTHER: the gate's tile)."""
    other = tl.load(OTHER, mask=mask, other=0.0).to(tl.float32)
    if KIND == 1:
        w = tl.load(NORM_W + ks)
        return gated_norm_rows(x.to(tl.float32), other, w, DIM, eps, x.dtype)
    return sigmoid_gate_rows(x.to(tl.float32), other, x.dtype)


@triton.jit
def _conv_epilogue(
    acc, rows, cols, mask, M, STATE, CONV_W, SLOTS, CACHED, CHANNELS, KW: tl.constexpr,
    DTYPE: tl.constexpr,
):  # fmt: skip
    """The tile acc [BLOCK_N columns, BLOCK_M rows] (fp32 sums) in DTYPE, its conv channels
    (columns < CHANNELS) replaced by silu(conv) of the rounded product, each such (row,
    channel) window shifted in its row's slot: what the decode conv kernel computes from the
    stored product."""
    product = acc.to(DTYPE)
    row_in = rows < M
    slot = tl.load(SLOTS + rows, mask=row_in, other=0).to(tl.int64)
    keep = tl.load(CACHED + rows, mask=row_in, other=0) > 0
    conv = cols[:, None] < CHANNELS
    windows = STATE + slot[None, :] * (CHANNELS * (KW - 1)) + cols[:, None] * (KW - 1)
    convolved = conv_decode_step(
        windows, CONV_W + cols[:, None] * KW, product, mask & conv, keep[None, :], KW
    )
    return tl.where(conv, convolved.to(DTYPE), product)


@triton.jit
def _prefetch_l2(W, rows, start, N, K, stride_wn, LINES: tl.constexpr):
    """`prefetch.global.L2` of LINES 128-byte lines from column `start` of each weight row in
    `rows`, every address clamped inside the [N, K] weight (a hint: nothing is loaded to a
    register, nothing waits for it)."""
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    ks = tl.minimum(start + tl.arange(0, LINES) * 64, K - 1)  # LINE values a line
    at = W + rows[:, None] * stride_wn + ks[None, :]
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; // $0", "=r,l", [at], dtype=tl.int32, is_pure=False, pack=1
    )
