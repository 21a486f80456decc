"""A dense GEMM for few rows (`engine.dense_kernel: triton`): out [M, N] = x [M, K] @ W[N, K]^T
for M up to MAX_ROWS, every row of x in one tile, the weight streamed from HBM once.

Why: at M <= 64 (a decode step's rows) a projection reads 2 N K bytes of weight and does 2 M N K
flops: 64 flops a byte at M = 64, against the H200's ~990 TFLOP/s over ~4.8 TB/s (~200 a
byte): memory-bound. What matters is keeping HBM busy: enough programs, and enough bytes in
flight in each. Little's law: 4.8 TB/s x ~0.8 us of latency = ~3.8 MB in flight over 132 SMs,
~29 KB an SM.

The tiles, the K split and the programs at 0.8b's and Orpheus 3b's shapes: gemm_config.py.

With programmatic dependent launch (`engine.pdl`, engine/kernels/triton_launch.py) a program
asks L2 for the head of its weight slice (`prefetch_lines` 128-byte lines of each of its
BLOCK_N rows, at most PREFETCH_BYTES) before it waits for the kernel before it: the weight
depends on no earlier kernel, so its first bytes stream while that kernel finishes, and the
loop then reads them from L2. A GEMM here is ~7-10 us of launch, ramp and latency for ~2-4 us
of weight traffic (0.8b, 64 rows): the wait is what the prefetch hides.

Epilogues (`engine.dense_epilogues`, triton_gemm_fused.py, docs/KERNELS.md): `silu_mul=True`
(the MLP's [gate; up]: silu(gate) * up), `partials=True` (a split's fp32 partials for the norm
that sums them), `conv=` (a decode step's Gated DeltaNet conv on the in-projection's product):
each rounds where the unfused kernels round (INVARIANTS 89).

x's rows may be strided (a gathered or split view), its last axis contiguous; the weight is
[N, K] contiguous (a Linear's, a packed buffer's, or a view of its rows). Grids come from the
shapes only, no host read of a device value: CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.config.kernels import DENSE_MAX_ROWS
from engine.kernels.gemm_config import SHAPES, GemmPlan, fuses_conv, fuses_prologue, plan
from engine.kernels.triton_gemm_fused import (
    ConvEpilogue,
    GatedNorm,
    Partials,
    SigmoidGate,
    _conv_epilogue,
    _prefetch_l2,
    _prologue,
    _silu_mul,
)
from engine.kernels.triton_launch import bound
from engine.kernels.triton_pdl import pdl_start

__all__ = [
    "MAX_ROWS", "SHAPES", "ConvEpilogue", "GatedNorm", "GemmPlan", "Partials", "SigmoidGate",
    "fuses_conv", "fuses_prologue", "plan", "skinny_linear", "takes",
]  # fmt: skip

MAX_ROWS = DENSE_MAX_ROWS  # callers run torch's GEMM above this many rows (prefill steps)
DTYPES = (torch.bfloat16, torch.float16)


def takes(dense_kernel: str, head: bool, x: torch.Tensor) -> bool:
    """Whether `engine.dense_kernel` puts a product of x [T, K] on this kernel: "triton" every
    one, "head" the LM head's alone, "torch" none; and only up to MAX_ROWS rows in DTYPES."""
    wanted = dense_kernel == "triton" or (dense_kernel == "head" and head)
    return wanted and x.shape[0] <= MAX_ROWS and x.dtype in DTYPES


@bound
@triton.jit(do_not_specialize=["M"])  # a step's rows: one compile per BLOCK_M, not per M % 16
def _skinny_gemm_kernel(
    X, W, OUT, M, N, K, stride_xm, stride_wn, stride_om, K_PER_SPLIT, CONV_STATE, CONV_W, SLOTS,
    CACHED, CHANNELS, OTHER, NORM_W, stride_or, stride_oh, HEAD, EPS, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, LINES: tl.constexpr = 1,
    SILU_MUL: tl.constexpr = False, PARTIAL: tl.constexpr = False, PDL: tl.constexpr = False,
    KW: tl.constexpr = 4, PROLOGUE: tl.constexpr = 0,
):  # fmt: skip
    """Program (n tile, split): its rows of the tile, fp32 over its K-slice. Without a split
    (PARTIAL off) it stores in OUT's dtype; with one, fp32 partials at OUT + split * M *
    stride_om. With SILU_MUL, W is [gate; up] ([2N, K]) and a tile is BLOCK_N of gate's rows
    and the same of up's: stored as silu(gate) * up [M, N] rounded as `silu_mul`, or as
    partials [M, 2N] (gate's, then up's). With PDL, first LINES lines of each of its weight
    rows asked of L2 (`_prefetch_l2`). PROLOGUE (1 the gated norm, 2 the sigmoid gate): each
    K tile of x as `_prologue` makes it of x's and OTHER's tiles (OTHER [M, heads, HEAD]; a
    tile lies inside one head)."""
    pid_n, split = tl.program_id(0), tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if PDL:  # the weight: no earlier kernel writes it, so before the wait
        _prefetch_l2(W, cols, split * K_PER_SPLIT, N, K, stride_wn, LINES)
        if SILU_MUL:
            _prefetch_l2(W + N * stride_wn, cols, split * K_PER_SPLIT, N, K, stride_wn, LINES)
    pdl_start(PDL)
    rows = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = X + rows[:, None] * stride_xm + ks[None, :]
    w_ptrs = W + cols[:, None].to(tl.int64) * stride_wn + ks[None, :]  # an LM head: 482M elems
    up_ptrs = w_ptrs + N * stride_wn  # SILU_MUL: up's rows, N below gate's
    row_ok, col_ok = rows[:, None] < M, cols[:, None] < N
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # out^T: the weight's rows lead
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    start = split * K_PER_SPLIT
    for k in range(start, tl.minimum(start + K_PER_SPLIT, K), BLOCK_K):
        if EVEN_K:
            x_ok, w_ok = row_ok, col_ok
        else:
            k_ok = (k + ks[None, :]) < K
            x_ok, w_ok = row_ok & k_ok, col_ok & k_ok
        x = tl.load(x_ptrs + k, mask=x_ok, other=0.0)
        if PROLOGUE != 0:  # the tile's head k // HEAD, its columns from k % HEAD
            other = OTHER + rows[:, None] * stride_or + (k // HEAD) * stride_oh + k % HEAD
            x = _prologue(x, other + ks[None, :], NORM_W, ks, x_ok, EPS, PROLOGUE, BLOCK_K)
        x = tl.trans(x)
        acc += tl.dot(tl.load(w_ptrs + k, mask=w_ok, other=0.0), x)
        if SILU_MUL:
            acc_up += tl.dot(tl.load(up_ptrs + k, mask=w_ok, other=0.0), x)
    out = OUT + split * M * stride_om + rows[None, :] * stride_om + cols[:, None]
    mask = (rows[None, :] < M) & col_ok
    if SILU_MUL and not PARTIAL:
        tl.store(out, _silu_mul(acc, acc_up, OUT.dtype.element_ty), mask=mask)
    elif CONV_STATE is not None:
        tl.store(out, _conv_epilogue(acc, rows, cols, mask, M, CONV_STATE, CONV_W, SLOTS, CACHED,
                                     CHANNELS, KW, OUT.dtype.element_ty), mask=mask)  # fmt: skip
    else:
        tl.store(out, acc.to(OUT.dtype.element_ty), mask=mask)
        if SILU_MUL:
            tl.store(out + N, acc_up.to(OUT.dtype.element_ty), mask=mask)


@bound
@triton.jit
def _split_sum_kernel(
    P, OUT, M, N, stride_om, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
    SILU_MUL: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """OUT[r, c] = sum over s of P[s, r, c] (fp32, in split order), rounded once; with
    SILU_MUL, silu(gate) * up of the sums of P[s, r, c] and P[s, r, N + c] (rows of 2N)."""
    pdl_start(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    row, col = offs // N, offs % N
    width = 2 * N if SILU_MUL else N
    at = P + row * width + col
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(at + s * M * width, mask=mask, other=0.0)
        if SILU_MUL:
            acc_up += tl.load(at + s * M * width + N, mask=mask, other=0.0)
    if SILU_MUL:
        tl.store(OUT + row * stride_om + col, _silu_mul(acc, acc_up, OUT.dtype.element_ty),
                 mask=mask)  # fmt: skip
    else:
        tl.store(OUT + row * stride_om + col, acc.to(OUT.dtype.element_ty), mask=mask)


SUM_BLOCK = 1024


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None,
    split: int | None = None, silu_mul: bool = False, partials: bool = False,
    conv: ConvEpilogue | None = None, prologue: GatedNorm | SigmoidGate | None = None,
) -> torch.Tensor | Partials:  # fmt: skip
    """x [M, K] (bf16/fp16, M <= MAX_ROWS, rows may be strided) @ weight[N, K]^T -> [M, N] in
    x's dtype, accumulated in fp32; into `out` ([M, N], rows may be strided) when given.
    `split` forces the K split (`plan`'s otherwise). `silu_mul`: weight is [gate; up] (N even)
    and the result silu(gate) * up [M, N / 2], as triton_norms.silu_mul of the product.
    `partials`: a split product comes back as its `Partials`, unsummed (not with `out` or
    `silu_mul`; a product without a split comes back summed). `conv`: x's rows are a decode
    step's (one token each) and the product's first conv.channels columns come back as their
    causal conv + SiLU, each row's window in conv.state shifted, as triton_gdn.causal_conv of
    the product computes (only where `fuses_conv`: no split). `prologue`: the GEMM reads x as
    triton_norms.gated_norm (x [M, heads x dim], `GatedNorm`) or triton_norms.sigmoid_gate
    (`SigmoidGate`, its gate [M, heads, dim]) makes it (only where `fuses_prologue`)."""
    m, k = x.shape
    n = weight.shape[0]
    if (
        x.dtype not in DTYPES or m > MAX_ROWS or weight.shape[1] != k
        or (silu_mul and (n % 2 or partials)) or (partials and out is not None)
        or (conv is not None and (silu_mul or partials or conv.channels > n
                                  or not fuses_conv(m, n, k, split)))
        or (prologue is not None and (silu_mul or conv is not None
                                      or not fuses_prologue(m, n, k, *_head(prologue), split)))
    ):  # fmt: skip
        raise ValueError(
            f"skinny_linear: x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)}, "
            f"silu_mul={silu_mul}, partials={partials}, out={out is not None}, "
            f"conv={conv is not None}, prologue={type(prologue).__name__}"
        )
    if x.stride(1) != 1:
        x = x.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    p = plan(m, n, k, split)  # fused: the same programs, each half gate's rows, half up's
    n_out, block_n = (n // 2, p.block_n // 2) if silu_mul else (n, p.block_n)
    if out is None:
        out = torch.empty((m, n_out), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    target = out if p.split == 1 else torch.empty((p.split, m, n), dtype=torch.float32,
                                                   device=x.device)  # fmt: skip
    stride_target = out.stride(0) if p.split == 1 else n
    _skinny_gemm_kernel[(triton.cdiv(n_out, block_n), p.split)](
        x, weight, target, m, n_out, k, x.stride(0), weight.stride(0), stride_target,
        p.k_per_split, *_conv_arguments(conv), *_prologue_arguments(prologue, k),
        BLOCK_M=p.block_m, BLOCK_N=block_n,
        BLOCK_K=p.block_k, EVEN_K=k % p.block_k == 0, LINES=p.prefetch_lines,
        SILU_MUL=silu_mul, PARTIAL=p.split > 1, num_warps=p.warps, num_stages=p.stages,
        **({} if conv is None else {"KW": conv.weight.shape[1]}),
        **({} if prologue is None else {"PROLOGUE": 1 if isinstance(prologue, GatedNorm) else 2}),
    )  # fmt: skip
    if p.split == 1:
        return out
    if partials:
        return Partials(target, x.dtype)
    _split_sum_kernel[(triton.cdiv(m * n_out, SUM_BLOCK),)](
        target, out, m, n_out, out.stride(0), SPLIT=p.split, BLOCK=SUM_BLOCK,
        SILU_MUL=silu_mul, num_warps=4,
    )  # fmt: skip
    return out


def _conv_arguments(conv: ConvEpilogue | None) -> tuple:
    """The kernel's CONV_STATE, CONV_W, SLOTS, CACHED, CHANNELS (None and 0: no conv)."""
    if conv is None:
        return (None, None, None, None, 0)
    return (conv.state, conv.weight, conv.slots, conv.cached, conv.channels)


def _head(prologue: GatedNorm | SigmoidGate) -> tuple[int, bool]:
    """(the prologue's head width, whether its tile must be one whole head: the norm's)."""
    if isinstance(prologue, GatedNorm):
        return prologue.weight.shape[0], True
    return prologue.gate.shape[2], False


def _prologue_arguments(prologue: GatedNorm | SigmoidGate | None, k: int) -> tuple:
    """The kernel's OTHER, NORM_W, stride_or, stride_oh, HEAD, EPS (None and 0: none)."""
    if prologue is None:
        return (None, None, 0, 0, 1, 0.0)
    if isinstance(prologue, GatedNorm):
        z, dim = prologue.z, prologue.weight.shape[0]
        return (z, prologue.weight, z.stride(0), dim, dim, prologue.eps)
    gate = prologue.gate
    return (gate, None, gate.stride(0), gate.stride(1), gate.shape[2], 0.0)
