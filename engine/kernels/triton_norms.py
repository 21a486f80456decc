"""Triton kernels for the elementwise and per-row work of a step: RMS norms (with the residual
add fused), the gated norm of Gated DeltaNet, gated attention's sigmoid gate and
SiLU-and-multiply. An attention layer's inputs (q/k norm, rotary, the K/V store):
triton_rope.py.

Each kernel rounds where the torch reference (engine/layers) rounds, so the two agree to the
last bit in fp32 and to bf16 rounding in bf16: sums in fp32, one rounding per reference op;
the gated norm's sum of squares in fp64 (`gated_norm_rows`: no summation order changes it, so
the out-projection's prologue gets its bits), within fp32 rounding of the reference's.
Inputs may be strided views along the token axis (the split outputs of a packed projection);
the last axis must be contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton_gemm_fused import Partials, gated_norm_rows, sigmoid_gate_rows
from engine.kernels.triton_launch import bound
from engine.kernels.triton_pdl import pdl_start


@bound
@triton.jit
def _rms_norm_kernel(
    X, R, OUT, ROUT, W, ROWS, stride_x, stride_r, stride_o, N, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr = 0,
    GATHER: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """With SPLIT, X is a split GEMM's fp32 partials [SPLIT, rows, N] (triton_gemm.Partials):
    summed in split order and rounded to OUT's dtype, as the GEMM's own sum would. With
    GATHER, program i reads row ROWS[i] of X and R (and writes row i)."""
    pdl_start(PDL)
    row = tl.program_id(0)
    out_row = row
    if GATHER:
        row = tl.load(ROWS + row).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    if SPLIT:
        x = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            at = X + (s * tl.num_programs(0) + row) * stride_x + cols
            x += tl.load(at, mask=mask, other=0.0)
        x = x.to(OUT.dtype.element_ty).to(tl.float32)
    else:
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:  # the reference adds in the model dtype, then normalises the rounded sum
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(ROUT.dtype.element_ty)
        tl.store(ROUT + out_row * N + cols, s, mask=mask)
        x = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0)
    tl.store(OUT + out_row * stride_o + cols, (x * inv * w).to(OUT.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor | Partials, weight: torch.Tensor, eps: float,
    residual: torch.Tensor | None = None, rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """x [T, N] (rows may be strided), or a split GEMM's unsummed `Partials` (then a residual
    is required: the sum is never returned); weight fp32 [N], the scale already applied
    (1 + w). With `residual`: s = x + residual (rounded to x's dtype) is normalised and
    returned as the new residual. `rows` [R] (not with partials): the rows x[rows] and
    residual[rows] read, in one launch (the head's last tokens). Returns (normed, s or x)."""
    if rows is not None and (isinstance(x, Partials) or residual is None):
        raise ValueError("rms_norm gathers rows of a summed product with its residual")
    split = 0
    if isinstance(x, Partials):
        if residual is None:
            raise ValueError("rms_norm of a split product's partials needs the residual")
        split, dtype, x = x.sums.shape[0], x.dtype, x.sums
        count, n = x.shape[1:]
    else:
        (count, n), dtype = x.shape, x.dtype
    count = count if rows is None else rows.shape[0]
    out = torch.empty((count, n), dtype=dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else x
    r = residual if residual is not None else x
    if count:
        _rms_norm_kernel[(count,)](
            x, r, out, res_out, weight, rows, x.stride(-2), r.stride(0), out.stride(0), n, eps,
            HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n), SPLIT=split,
            GATHER=rows is not None,
        )  # fmt: skip
    return out, res_out


@bound
@triton.jit
def _gated_norm_kernel(
    X, Z, OUT, W, stride_zt, H, D, eps, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    pdl_start(PDL)
    pid = tl.program_id(0)
    t, h = pid // H, pid % H
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(X + pid * D + cols[None, :], mask=mask[None, :], other=0.0).to(tl.float32)
    z = tl.load(Z + t * stride_zt + h * D + cols[None, :], mask=mask[None, :], other=0.0)
    w = tl.load(W + cols, mask=mask, other=0.0)
    out = gated_norm_rows(x, z.to(tl.float32), w, D, eps, OUT.dtype.element_ty)
    tl.store(OUT + pid * D + cols[None, :], out, mask=mask[None, :])


def gated_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float):
    """norm(x) * weight * silu(z) per head (`gated_norm_rows`, which the out-projection's
    prologue shares). x [T, H, D] contiguous, z [T, H * D] (rows may be strided), weight fp32
    [D]. Returns [T, H * D] in x's dtype."""
    tokens, heads, dim = x.shape
    out = torch.empty((tokens, heads * dim), dtype=x.dtype, device=x.device)
    if tokens:
        _gated_norm_kernel[(tokens * heads,)](
            x, z, out, weight, z.stride(0), heads, dim, eps, BLOCK=triton.next_power_of_2(dim)
        )
    return out


@bound
@triton.jit
def _sigmoid_gate_kernel(
    X, G, OUT, stride_xt, stride_gt, stride_gh, N, HEAD: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_start(PDL)
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + t * stride_xt + cols, mask=mask, other=0.0).to(tl.float32)
    at = G + t * stride_gt + (cols // HEAD) * stride_gh + cols % HEAD
    gate = tl.load(at, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + t * N + cols, sigmoid_gate_rows(x, gate, OUT.dtype.element_ty), mask=mask)


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate) (`sigmoid_gate_rows`, which o_proj's prologue shares): gated
    attention's output. x [T, H * D] (rows may be strided), gate [T, H, D] (each head's D
    contiguous, rows and heads may be strided: a view of the packed q projection). Returns
    [T, H * D] in x's dtype."""
    tokens, heads, dim = gate.shape
    out = torch.empty((tokens, heads * dim), dtype=x.dtype, device=x.device)
    block = 1024
    if tokens:
        _sigmoid_gate_kernel[(tokens, triton.cdiv(heads * dim, block))](
            x,
            gate,
            out,
            x.stride(0),
            gate.stride(0),
            gate.stride(1),
            heads * dim,
            HEAD=dim,
            BLOCK=block,
        )
    return out


@bound
@triton.jit
def _silu_mul_kernel(X, OUT, stride_x, N, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_start(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    gate = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + N + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * N + cols, (act * up).to(OUT.dtype.element_ty), mask=mask)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2N] = [gate | up] -> silu(gate) * up [T, N], rounded as the reference rounds."""
    rows, n = x.shape[0], x.shape[1] // 2
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    block = 1024
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(n, block))](x, out, x.stride(0), n, BLOCK=block)
    return out
