"""The Gated DeltaNet short conv on Triton, in place on the conv-state pool (`causal_conv`):
the depthwise conv + SiLU over every row's new tokens (varlen), the window before a row's
first new token read from its conv-state slot (zeros for a row with nothing cached), then the
slot rewritten with the row's last kernel-1 inputs. Conv state [slots, channels, kernel-1]."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton_launch import bound
from engine.kernels.triton_pdl import pdl_start


@bound
@triton.jit
def _conv_kernel(
    X, W, STATE, OUT, TOKEN_ROW, CU, CACHED, SLOTS, stride_xt, C,
    KW: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    row = tl.load(TOKEN_ROW + t)
    start = tl.load(CU + row)
    keep = tl.load(CACHED + row) > 0  # a row with nothing cached starts from zeros
    slot = tl.load(SLOTS + row).to(tl.int64)
    p = t - start
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for j in tl.static_range(KW):
        q = p - (KW - 1) + j  # input position of tap j; < 0 reads the slot's window
        xv = tl.load(X + (start + q) * stride_xt + cols, mask=cmask & (q >= 0), other=0.0)
        sidx = tl.maximum(q + KW - 1, 0)
        sv = tl.load(
            STATE + slot * C * (KW - 1) + cols * (KW - 1) + sidx,
            mask=cmask & (q < 0) & keep,
            other=0.0,
        )
        w = tl.load(W + cols * KW + j, mask=cmask, other=0.0).to(tl.float32)
        acc += w * (xv.to(tl.float32) + sv.to(tl.float32))
    out = acc / (1.0 + tl.exp(-acc))
    tl.store(OUT + t * C + cols, out.to(OUT.dtype.element_ty), mask=cmask)


@bound
@triton.jit
def _conv_state_kernel(
    X, STATE, CU, CACHED, SLOTS, ROWS, stride_xt, C, KW: tl.constexpr, BLOCK_C: tl.constexpr
):
    row = tl.program_id(0)
    if ROWS is not None:  # a fixed grid: programs past the step's rows (read here) exit
        if row >= tl.load(ROWS):
            return
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    start = tl.load(CU + row)
    n = tl.load(CU + row + 1) - start
    keep = tl.load(CACHED + row) > 0
    base = STATE + tl.load(SLOTS + row).to(tl.int64) * C * (KW - 1) + cols * (KW - 1)
    # In place, ascending: entry j reads old entry n + j > j, which no earlier store touched.
    for j in tl.static_range(KW - 1):
        q = n - (KW - 1) + j
        xv = tl.load(X + (start + q) * stride_xt + cols, mask=cmask & (q >= 0), other=0.0)
        sv = tl.load(base + tl.minimum(n + j, KW - 2), mask=cmask & (q < 0) & keep, other=0.0)
        value = tl.where(q >= 0, xv.to(tl.float32), sv.to(tl.float32))
        tl.store(base + j, value.to(STATE.dtype.element_ty), mask=cmask & (n > 0))


@triton.jit
def conv_decode_step(WINDOW, TAPS, x, mask, keep, KW: tl.constexpr):
    """One token's causal conv + SiLU and its window's shift, elementwise over any shape of
    (row, channel) pairs: WINDOW points at each pair's K-1 stored inputs (oldest first, its
    row's slot), TAPS at its channel's K taps, x is the new input (in the model's dtype);
    `keep` false: the window is zeros (a row with nothing cached). Returns silu(conv) in fp32
    and stores the window shifted by one, x last. The taps sum in order, oldest first, x last:
    the decode kernel here and the dense GEMM's fused epilogue (triton_gemm_fused) round
    alike."""
    acc = x.to(tl.float32) * 0.0
    for j in tl.static_range(KW - 1):
        stored = tl.load(WINDOW + j, mask=mask & keep, other=0.0).to(tl.float32)
        acc += tl.load(TAPS + j, mask=mask, other=0.0).to(tl.float32) * stored
    acc += tl.load(TAPS + KW - 1, mask=mask, other=0.0).to(tl.float32) * x.to(tl.float32)
    for j in tl.static_range(KW - 2):  # ascending: entry j + 1 is read before it is written
        tl.store(WINDOW + j, tl.load(WINDOW + j + 1, mask=mask & keep, other=0.0), mask=mask)
    tl.store(WINDOW + KW - 2, x.to(WINDOW.dtype.element_ty), mask=mask)
    return acc / (1.0 + tl.exp(-acc))


@bound
@triton.jit
def _conv_decode_kernel(
    X, W, STATE, OUT, CACHED, SLOTS, stride_xt, C, KW: tl.constexpr, BLOCK_C: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """A decode step's conv (one token a row, so token = row) and its state shift, in one
    program per (row, channel block)."""
    pdl_start(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    keep = tl.load(CACHED + row) > 0
    window = STATE + tl.load(SLOTS + row).to(tl.int64) * C * (KW - 1) + cols * (KW - 1)
    x = tl.load(X + row * stride_xt + cols, mask=cmask, other=0.0)
    out = conv_decode_step(window, W + cols * KW, x, cmask, keep, KW)
    tl.store(OUT + row * C + cols, out.to(OUT.dtype.element_ty), mask=cmask)


def causal_conv(x, weight, conv_state, meta) -> torch.Tensor:
    """x [T, C] (rows may be strided), weight [C, K]; `meta` is the step's ForwardBatch
    (token_row, cu_seqlens, cached, state_slots as int32 device tensors). Returns silu(conv)
    [T, C] in x's dtype and updates each row's slot of conv_state [slots, C, K-1]. A decode
    step (one token a row) runs one fused launch, any other step two. With staged tables
    (`meta.gdn_tables`: a step padded to a token bucket), the two launches on grids fixed by
    the token count, the row count read from the device: a padding token (token_row 0) writes
    only its own output."""
    tokens, channels = x.shape
    kernel = weight.shape[1]
    out = torch.empty((tokens, channels), dtype=x.dtype, device=x.device)
    block = 256
    grid_c = triton.cdiv(channels, block)
    staged = getattr(meta, "gdn_tables", None)
    rows, row_count = meta.num_rows, None
    if staged is not None:
        rows, row_count = staged.row_bound(tokens), staged.counts[2:]
    if tokens and staged is None and getattr(meta, "is_decode", False):
        _conv_decode_kernel[(tokens, grid_c)](
            x, weight, conv_state, out, meta.cached, meta.state_slots, x.stride(0), channels,
            KW=kernel, BLOCK_C=block,
        )  # fmt: skip
    elif tokens:
        _conv_kernel[(tokens, grid_c)](
            x, weight, conv_state, out, meta.token_row, meta.cu_seqlens, meta.cached,
            meta.state_slots, x.stride(0), channels, KW=kernel, BLOCK_C=block,
        )  # fmt: skip
        _conv_state_kernel[(rows, grid_c)](
            x, conv_state, meta.cu_seqlens, meta.cached, meta.state_slots, row_count,
            x.stride(0), channels, KW=kernel, BLOCK_C=block,
        )  # fmt: skip
    return out
