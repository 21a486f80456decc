"""Triton kernels of Gated DeltaNet that work on the state pool in place, through each row's
slot index: no gather of a batch's states, no scatter back.

- `causal_conv`: the short depthwise conv + SiLU over every row's new tokens (varlen), the
  window before a row's first new token read from its conv-state slot (zeros for a row with
  nothing cached), then the slot rewritten with the row's last kernel-1 inputs.
- `gated_delta_recurrent`: the gated delta rule token by token per (row, value head, value
  block), gates, q/k l2 norm and scale computed in the kernel, the fp32 state read from and
  written back to the row's slot. The decode step (one token a row) and exact fp32 prefill.
- `gated_delta_chunked`: the same rule a chunk of C tokens at a time (the WY form of
  engine/layers/gated_delta.py's `torch_gated_delta_rule_chunked`), one launch per layer
  whatever the rows: per (row, value head, value block) a loop over the row's chunks, each a
  few tile products, the triangular solve among them by blocks (7 substitution steps on the
  8x8 diagonal blocks at once, then log2(C/8) block doublings), the state carried in
  registers from chunk to chunk. The grid depends on the row count alone, so a prefill step pays one
  launch where flash-linear-attention's chunked kernel pays about nine and its wrappers.
- `gated_delta_chunked_split`: the same in three launches (prepare, states, outputs), whose
  serial part is two tile products a chunk.
- `gated_delta_prefill`: a prefill or mixed step's dispatch: the leading rows of one new token
  (a mixed step's decode rows) through the recurrence, the rest through a chunked kernel
  (`triton`, `triton_split`, or `auto`: the split one for rows of SPLIT_FROM_TOKENS or more).
- `gated_delta_fixed_grid`: the same dispatch (recurrence, then the split kernel) for a step
  padded to a token bucket, on grids set by the bucket, the step's counts and chunk tables
  read from the device where the step inputs staged them: what a CUDA graph can capture
  (engine.piecewise_gdn). The row and chunk kernels take those device bounds (`ROWS`,
  `ROW_RANGE`, `CHUNKS`; None: a grid sized on the host) and their programs past them exit,
  or (`PERSISTENT`) fewer programs stride over them.

The split kernel launches as a `SplitConfig` says (engine/config/gdn_split.py: chunk, value
blocks, warps, stages, the fixed grids' program counts, the scores option); the default is
the launch it always had.

Layouts follow the torch reference (engine/layers/gated_delta.py): conv state
[slots, channels, kernel-1], recurrent state [slots, heads, k_dim, v_dim] (fp32, or bf16 with
engine.state_dtype: the kernels read it into fp32 and round it back on the store).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from engine.config.gdn_split import SPLIT_DEFAULT, SPLIT_FROM_TOKENS, SplitConfig
from engine.kernels.gdn_tables import chunk_tables, max_chunks, one_token_prefix
from engine.kernels.triton_launch import bound
from engine.kernels.triton_pdl import pdl_start
from engine.layers.sampler import rows_to


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


@bound
@triton.jit
def _conv_decode_kernel(
    X, W, STATE, OUT, CACHED, SLOTS, stride_xt, C,
    KW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """A decode step's conv (one token a row, so token = row) and its state shift, in one
    program per (row, channel block): both read the old window before either is stored."""
    pdl_start(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    taps = tl.arange(0, BLOCK_K)  # the window's K-1 stored inputs (BLOCK_K >= K-1)
    stored = taps < KW - 1
    keep = tl.load(CACHED + row) > 0
    base = STATE + tl.load(SLOTS + row).to(tl.int64) * C * (KW - 1) + cols[:, None] * (KW - 1)
    window = tl.load(base + taps[None, :], mask=cmask[:, None] & stored[None, :] & keep, other=0.0)
    x = tl.load(X + row * stride_xt + cols, mask=cmask, other=0.0)
    w = tl.load(W + cols[:, None] * KW + taps[None, :], mask=cmask[:, None] & stored[None, :],
                other=0.0).to(tl.float32)  # fmt: skip
    w_last = tl.load(W + cols * KW + KW - 1, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.sum(w * window.to(tl.float32), axis=1) + w_last * x.to(tl.float32)
    tl.store(OUT + row * C + cols, (acc / (1.0 + tl.exp(-acc))).to(OUT.dtype.element_ty),
             mask=cmask)  # fmt: skip
    # The new window: the old one shifted by one, this token last.
    shifted = tl.load(base + taps[None, :] + 1, mask=cmask[:, None] & (taps[None, :] + 1 < KW - 1)
                      & keep, other=0.0)  # fmt: skip
    shifted = tl.where(taps[None, :] == KW - 2, x[:, None].to(shifted.dtype), shifted)
    tl.store(base + taps[None, :], shifted.to(STATE.dtype.element_ty),
             mask=cmask[:, None] & stored[None, :])  # fmt: skip


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
            KW=kernel, BLOCK_C=block, BLOCK_K=triton.next_power_of_2(kernel - 1),
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


@triton.jit
def _first_row(ROW0, ROW_RANGE):
    """A row program's first row, and whether the program lies past the step's rows: ROW0
    given on the host, or with a fixed grid (ROW_RANGE not None) the rows [first, end) read
    from the device, programs past `end` to exit."""
    row0 = ROW0
    past = False
    if ROW_RANGE is not None:
        row0 = tl.load(ROW_RANGE)
        past = tl.program_id(0) + row0 >= tl.load(ROW_RANGE + 1)
    return row0, past


@triton.jit
def _row_state_tile(
    STATE, CU, CACHED, SLOTS, row, HV, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr
):
    """A (row, value head, value block) program's head and value block (grid axes 1 and 2) on
    `row`: the row's tokens [start, end), its value columns, and its fp32 state tile [DK, BV]
    read from the row's slot (zeros for a row with nothing cached) with the pointers to store
    it back through."""
    h, vb = tl.program_id(1), tl.program_id(2)
    start = tl.load(CU + row)
    end = tl.load(CU + row + 1)
    keep = tl.load(CACHED + row) > 0
    slot = tl.load(SLOTS + row).to(tl.int64)
    kd = tl.arange(0, DK)
    vd = vb * BV + tl.arange(0, BV)
    vmask = vd < DV
    sptr = STATE + ((slot * HV + h) * DK + kd[:, None]) * DV + vd[None, :]
    state = tl.load(sptr, mask=vmask[None, :] & keep, other=0.0).to(tl.float32)
    return h, start, end, vd, vmask, sptr, state


# A step's first row (ROW0: a mixed step's leading decode rows, 0, 1, 3, 16, ...) is not
# specialised: Triton would compile a variant for ints divisible by 16 and one for the rest,
# each compile of these kernels seconds long, paid inside a server's first steps (a fresh
# server's first minutes then run at a few hundred tok/s). See `_chunk_tables` too.
_PER_STEP = ["ROW0"]


@bound
@triton.jit(do_not_specialize=_PER_STEP)
def _gdn_recurrent_kernel(
    QKV, A, B, A_LOG, DT_BIAS, STATE, OUT, CU, CACHED, SLOTS,
    ROW0, ROW_RANGE, stride_t, stride_ab, HK, HV, scale,
    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, PERSISTENT: tl.constexpr,
    ONE_PASS: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_start(PDL)
    if PERSISTENT:  # a fixed grid narrower than its bound: the programs stride over the rows
        first, end = tl.load(ROW_RANGE), tl.load(ROW_RANGE + 1)
        for row in range(first + tl.program_id(0), end, tl.num_programs(0)):
            _recurrent_row(
                QKV, A, B, A_LOG, DT_BIAS, STATE, OUT, CU, CACHED, SLOTS, row, stride_t,
                stride_ab, HK, HV, scale, DK, DV, BV, ONE_PASS,
            )  # fmt: skip
    else:
        row0, past = _first_row(ROW0, ROW_RANGE)
        if past:
            return
        _recurrent_row(
            QKV, A, B, A_LOG, DT_BIAS, STATE, OUT, CU, CACHED, SLOTS, tl.program_id(0) + row0,
            stride_t, stride_ab, HK, HV, scale, DK, DV, BV, ONE_PASS,
        )  # fmt: skip


@triton.jit
def _recurrent_row(
    QKV, A, B, A_LOG, DT_BIAS, STATE, OUT, CU, CACHED, SLOTS, row, stride_t, stride_ab, HK, HV,
    scale, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, ONE_PASS: tl.constexpr,
):  # fmt: skip
    """The recurrence over one row's tokens for the program's value head and block. ONE_PASS:
    both of a token's sums over the state's key axis (S^T k and S^T q) from the state as it
    came in, so they do not wait on each other, and the update applied after; the same rule
    (out = S'^T q with S' = g S + k d^T is g S^T q + (k . q) d), summed in another order."""
    h, start, end, vd, vmask, sptr, state = _row_state_tile(
        STATE, CU, CACHED, SLOTS, row, HV, DK, DV, BV
    )
    for t in range(start, end):
        state = _token_update(
            QKV, A, B, A_LOG, DT_BIAS, OUT, state, t, h, vd, vmask, stride_t, stride_ab, HK, HV,
            scale, DK, DV, ONE_PASS,
        )  # fmt: skip
    tl.store(sptr, state.to(STATE.dtype.element_ty), mask=vmask[None, :])


@triton.jit
def _token_update(
    QKV, A, B, A_LOG, DT_BIAS, OUT, state, t, h, vd, vmask, stride_t, stride_ab, HK, HV, scale,
    DK: tl.constexpr, DV: tl.constexpr, ONE_PASS: tl.constexpr,
):  # fmt: skip
    """Token t of value head h on the fp32 state tile [DK, value columns vd]: its gates, q/k
    l2 norms and scale, the delta rule's update; stores the token's output columns and
    returns the updated state. ONE_PASS: see `_recurrent_row`."""
    hk = h // (HV // HK)  # each q/k head serves consecutive value heads
    kd = tl.arange(0, DK)
    a_log = tl.load(A_LOG + h).to(tl.float32)
    dt_bias = tl.load(DT_BIAS + h).to(tl.float32)
    base = QKV + t * stride_t
    q = tl.load(base + hk * DK + kd).to(tl.float32)
    k = tl.load(base + HK * DK + hk * DK + kd).to(tl.float32)
    v = tl.load(base + 2 * HK * DK + h * DV + vd, mask=vmask, other=0.0).to(tl.float32)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    a = tl.load(A + t * stride_ab + h).to(tl.float32) + dt_bias
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
    g = -tl.exp(a_log) * softplus
    beta = 1.0 / (1.0 + tl.exp(-tl.load(B + t * stride_ab + h).to(tl.float32)))
    if ONE_PASS:
        decay = tl.exp(g)
        sk = tl.sum(state * k[:, None], axis=0)
        sq = tl.sum(state * q[:, None], axis=0)
        delta = beta * (v - decay * sk)
        out = decay * sq + tl.sum(k * q, axis=0) * delta
        state = state * decay + k[:, None] * delta[None, :]
    else:
        state = state * tl.exp(g)
        predicted = tl.sum(state * k[:, None], axis=0)
        state = state + k[:, None] * (beta * (v - predicted))[None, :]
        out = tl.sum(state * q[:, None], axis=0)
    tl.store(OUT + (t * HV + h) * DV + vd, out.to(OUT.dtype.element_ty), mask=vmask)
    return state


@bound
@triton.jit(do_not_specialize=["tiles"])
def _gdn_decode_pipelined_kernel(
    QKV, A, B, A_LOG, DT_BIAS, STATE, OUT, CU, CACHED, SLOTS, tiles, stride_t, stride_ab, HK,
    HV, scale, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, STAGES: tl.constexpr,
    ONE_PASS: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Rows of one token each (a decode step's; `engine.gdn_decode: pipelined`): `tiles` =
    rows x value heads x value blocks, which the programs stride over, each tile's state read
    STAGES - 1 tiles ahead of its use (Triton's pipeliner: cp.async into shared memory) so
    that the fp32 state streams in while the tile before computes and stores. The same
    arithmetic as `_recurrent_row` on one token."""
    pdl_start(PDL)
    blocks = tl.cdiv(DV, BV)
    kd = tl.arange(0, DK)
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), num_stages=STAGES):
        row = tile // (blocks * HV)
        h = (tile // blocks) % HV
        vd = (tile % blocks) * BV + tl.arange(0, BV)
        vmask = vd < DV
        keep = tl.load(CACHED + row) > 0
        slot = tl.load(SLOTS + row).to(tl.int64)
        sptr = STATE + ((slot * HV + h) * DK + kd[:, None]) * DV + vd[None, :]
        state = tl.load(sptr, mask=vmask[None, :] & keep, other=0.0).to(tl.float32)
        state = _token_update(
            QKV, A, B, A_LOG, DT_BIAS, OUT, state, tl.load(CU + row), h, vd, vmask, stride_t,
            stride_ab, HK, HV, scale, DK, DV, ONE_PASS,
        )  # fmt: skip
        tl.store(sptr, state.to(STATE.dtype.element_ty), mask=vmask[None, :])


# The recurrence's launch (a decode step's Gated DeltaNet, the leading one-token rows of a
# mixed step): value columns a program and warps a program. benchmarks/bench_gdn_kernels.py
# --recurrent times others (at batch 64 the recurrence reads its fp32 state at ~72% of the
# H200's bandwidth). Of the 16 launches swept (one layer call, 0.8b, fp32 state) 64 columns x
# 4 warps is the fastest at 64 and 128 rows; 1 warp a program spills at 64 columns and more.
RECURRENT_BV, RECURRENT_WARPS = 64, 4
# The recurrence's two sums in one pass over the incoming state (`_recurrent_row`'s ONE_PASS),
# against the sum of the updated state: `bench_gdn_kernels --recurrent` times both forms of the
# engine's launch. Off: slower on the H200 (about 15% at 64 rows).
RECURRENT_ONE_PASS = False


# `engine.gdn_decode: pipelined` (`_gdn_decode_pipelined_kernel`): value columns a tile, warps
# and programs an SM, and the pipeline's stages (2: one tile's state in flight ahead; the
# sm_90 compile at BV 64: 167 registers, so 3 programs of 4 warps an SM, and 34 KB of shared
# memory). Not yet measured on a GPU: `bench_gdn_kernels --recurrent` times the pipelined
# form under each launch of its PIPELINED_SWEEP beside the grid's.
PIPELINED_BV, PIPELINED_WARPS, PIPELINED_PER_SM, PIPELINED_STAGES = 64, 4, 3, 2
SMS = 132  # the H200's streaming multiprocessors


def gated_delta_recurrent(
    qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim,
    row0: int = 0, rows: int | None = None, out: torch.Tensor | None = None,
    pipelined: bool = False,
):  # fmt: skip
    """qkv [T, 2*Hk*K + Hv*V] (the conv's output, [q | k | v]); a, b [T, Hv] (rows may be
    strided). Returns o [T, Hv, V] in qkv's dtype; each row's slot of ssm_state is updated.
    `rows` rows from `row0` (default: every row from `row0` on) run, their tokens written into
    `out` where given (the other rows' tokens are left as they are). `pipelined`: every row
    has one token and starts at row 0 (a decode step's, a mixed step's leading rows): the
    persistent, pipelined kernel (`engine.gdn_decode: pipelined`) runs them."""
    if pipelined:
        if row0:
            raise ValueError(f"the pipelined recurrence runs rows from 0, got row0={row0}")
        return _decode_pipelined(
            qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim, rows, out
        )
    return _launch(
        _gdn_recurrent_kernel, qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim,
        row0, rows, out, bv=RECURRENT_BV, num_warps=RECURRENT_WARPS, PERSISTENT=False,
        ONE_PASS=RECURRENT_ONE_PASS,
    )  # fmt: skip


def _decode_pipelined(
    qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim, rows, out
) -> torch.Tensor:
    """`gated_delta_recurrent` on `rows` one-token rows from row 0, on min(tiles, SMS x
    PIPELINED_PER_SM) programs: a grid set by the row count alone (a decode graph's bucket)."""
    v_heads = a.shape[1]
    out = _output(qkv, v_heads, v_dim, out)
    rows = meta.num_rows if rows is None else rows
    bv = min(PIPELINED_BV, triton.next_power_of_2(v_dim))
    tiles = rows * v_heads * triton.cdiv(v_dim, bv)
    if qkv.shape[0] and tiles:
        _gdn_decode_pipelined_kernel[(min(tiles, SMS * PIPELINED_PER_SM),)](
            qkv, a, b, A_log, dt_bias, ssm_state, out, meta.cu_seqlens, meta.cached,
            meta.state_slots, tiles, qkv.stride(0), a.stride(0), k_heads, v_heads, k_dim**-0.5,
            DK=k_dim, DV=v_dim, BV=bv, STAGES=PIPELINED_STAGES, ONE_PASS=RECURRENT_ONE_PASS,
            num_warps=PIPELINED_WARPS,
        )  # fmt: skip
    return out


def _output(qkv, v_heads: int, v_dim: int, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        out = torch.empty((qkv.shape[0], v_heads, v_dim), dtype=qkv.dtype, device=qkv.device)
    return out


def _launch(
    kernel, qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim,
    row0: int, rows: int | None, out: torch.Tensor | None, row_range=None, bv: int = 32,
    num_warps: int = 4, **const,
):  # fmt: skip
    """One launch of a Gated DeltaNet kernel: a program per (row, value head, value block of
    `bv` columns) for `rows` rows from `row0`; with `row_range` (a device [first, end) pair),
    `rows` programs for the rows from `first`, those past `end` exiting (a fixed grid)."""
    v_heads = a.shape[1]
    out = _output(qkv, v_heads, v_dim, out)
    rows = meta.num_rows - row0 if rows is None else rows
    bv = min(bv, triton.next_power_of_2(v_dim))
    if qkv.shape[0] and rows:
        kernel[(rows, v_heads, triton.cdiv(v_dim, bv))](
            qkv, a, b, A_log, dt_bias, ssm_state, out, meta.cu_seqlens, meta.cached,
            meta.state_slots, row0, row_range, qkv.stride(0), a.stride(0), k_heads, v_heads,
            k_dim**-0.5, DK=k_dim, DV=v_dim, BV=bv, num_warps=num_warps, **const,
        )  # fmt: skip
    return out


@bound
@triton.jit(do_not_specialize=_PER_STEP)
def _gdn_chunked_kernel(
    QKV, A, B, A_LOG, DT_BIAS, STATE, OUT, CU, CACHED, SLOTS,
    ROW0, ROW_RANGE, stride_t, stride_ab, HK, HV, scale,
    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    LEVELS: tl.constexpr,
):  # fmt: skip
    row0, past = _first_row(ROW0, ROW_RANGE)
    if past:
        return
    h, start, end, vd, vmask, sptr, state = _row_state_tile(
        STATE, CU, CACHED, SLOTS, tl.program_id(0) + row0, HV, DK, DV, BV
    )  # state [DK, BV]
    hk = h // (HV // HK)
    kd = tl.arange(0, DK)
    ci = tl.arange(0, C)
    below = ci[:, None] > ci[None, :]  # s < t: where the delta-rule corrections reach
    causal = ci[:, None] >= ci[None, :]
    a_log = tl.load(A_LOG + h).to(tl.float32)
    dt_bias = tl.load(DT_BIAS + h).to(tl.float32)
    for c0 in range(start, end, C):
        t = c0 + ci
        live = t < end  # tokens past the row's end: k = v = 0, g = beta = 0, no effect
        base = QKV + t[:, None] * stride_t
        q = tl.load(base + hk * DK + kd[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        k = tl.load(base + (HK + hk) * DK + kd[None, :], mask=live[:, None], other=0.0)
        k = k.to(tl.float32)
        v = tl.load(
            base + 2 * HK * DK + h * DV + vd[None, :],
            mask=live[:, None] & vmask[None, :],
            other=0.0,
        ).to(tl.float32)
        q = q / tl.sqrt(tl.sum(q * q, axis=1) + 1e-6)[:, None] * scale
        k = k / tl.sqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
        a = tl.load(A + t * stride_ab + h, mask=live, other=0.0).to(tl.float32) + dt_bias
        softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
        g = tl.where(live, -tl.exp(a_log) * softplus, 0.0)
        b = tl.load(B + t * stride_ab + h, mask=live, other=0.0).to(tl.float32)
        beta = tl.where(live, 1.0 / (1.0 + tl.exp(-b)), 0.0)
        cum = tl.cumsum(g, axis=0)  # log decay from the chunk's start, <= 0, falling
        last = tl.sum(tl.where(ci == C - 1, cum, 0.0), axis=0)
        decay = tl.where(causal, tl.exp(tl.where(causal, cum[:, None] - cum[None, :], 0.0)), 0.0)
        k_beta = k * beta[:, None]
        # (I + L) U = beta v - (beta k exp(cum)) S, L = below(beta_t k_t.k_s exp(cum_t - cum_s))
        lower = tl.where(below, tl.dot(k_beta, tl.trans(k)) * decay, 0.0)
        u = v * beta[:, None] - tl.dot(k_beta * tl.exp(cum)[:, None], state)
        # U = (I + L)^-1 u, the inverse built by blocks (stable, unlike a Neumann product,
        # whose powers of L grow and cancel when keys align); steps past the chunk's live
        # tokens are skipped (a decode row's single token: none).
        inverse = _unit_lower_inverse(lower, tl.minimum(end - c0, C), C, LEVELS)
        u = tl.dot(inverse, u, input_precision="ieee")
        out = tl.dot(q * tl.exp(cum)[:, None], state)
        out += tl.dot(tl.dot(q, tl.trans(k)) * decay, u)
        optr = OUT + (t[:, None] * HV + h) * DV + vd[None, :]
        tl.store(optr, out.to(OUT.dtype.element_ty), mask=live[:, None] & vmask[None, :])
        state = state * tl.exp(last) + tl.dot(tl.trans(k * tl.exp(last - cum)[:, None]), u)
    tl.store(sptr, state.to(STATE.dtype.element_ty), mask=vmask[None, :])


def _doublings(chunk: int) -> int:
    """The block doublings of `_unit_lower_inverse` from its 8x8 blocks up to a chunk; the
    chunk a power of two, 16 or more (tl.dot's smallest tile)."""
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= 16, got {chunk}")
    return chunk.bit_length() - 4


def gated_delta_chunked(
    qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim, chunk: int = 32,
    row0: int = 0, out: torch.Tensor | None = None,
):  # fmt: skip
    """`gated_delta_recurrent`'s contract for the rows from `row0` on, a chunk at a time (one
    launch for them all); `chunk` a power of two, 16 or more."""
    levels = _doublings(chunk)
    return _launch(
        _gdn_chunked_kernel, qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim,
        row0, None, out, C=chunk, LEVELS=levels,
    )  # fmt: skip


# The chunked rule split in three launches, as flash-linear-attention splits it: the chunks'
# factors in parallel, a short serial pass over the states, the outputs in parallel. Per chunk
# of C tokens, with T = (I + L)^-1 (see `_gdn_chunked_kernel`):
#   W = T (beta k e^G), U = T (beta v)          (prepare: every chunk at once)
#   V' = U - W S, S <- S e^G_last + K'^T V'     (states: chunk after chunk, two products)
#   O = (q e^G) S + (q k^T * decay) V'         (outputs: every chunk at once)
# where K' = k e^(G_last - G) and S is the state before the chunk. The serial chain of a
# long row is two tile products a chunk instead of the whole chunk's work.
# Registers (ptxas -v for sm_90 at 0.8b's shapes, C=32): with every product in fp32 FMA
# ("ieee") the state pass spilled 9 KB a thread; in TF32 on tensor cores with 16 value
# columns a program, none of the three spills. The 32x32 products of the inverse stay fp32.


@triton.jit
def _chunk_gates_and_keys(
    QKV, A, B, A_LOG, DT_BIAS, h, hk, t, live, stride_t, stride_ab, HK,
    DK: tl.constexpr,
):  # fmt: skip
    """A chunk's l2-normed keys [C, DK] and its gates: cum (log decay from the chunk's start),
    beta; tokens that are not live give k = 0, g = beta = 0."""
    kd = tl.arange(0, DK)
    k = tl.load(QKV + t[:, None] * stride_t + (HK + hk) * DK + kd[None, :], mask=live[:, None],
                other=0.0).to(tl.float32)  # fmt: skip
    k = k / tl.sqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
    a = tl.load(A + t * stride_ab + h, mask=live, other=0.0).to(tl.float32)
    a += tl.load(DT_BIAS + h).to(tl.float32)
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
    g = tl.where(live, -tl.exp(tl.load(A_LOG + h).to(tl.float32)) * softplus, 0.0)
    b = tl.load(B + t * stride_ab + h, mask=live, other=0.0).to(tl.float32)
    beta = tl.where(live, 1.0 / (1.0 + tl.exp(-b)), 0.0)
    return k, tl.cumsum(g, axis=0), beta


@triton.jit
def _chunk_queries(QKV, t, live, hk, stride_t, scale, DK: tl.constexpr):
    """A chunk's l2-normed, scaled queries [C, DK] (zero for tokens that are not live)."""
    kd = tl.arange(0, DK)
    q = tl.load(QKV + t[:, None] * stride_t + hk * DK + kd[None, :], mask=live[:, None],
                other=0.0).to(tl.float32)  # fmt: skip
    return q / tl.sqrt(tl.sum(q * q, axis=1) + 1e-6)[:, None] * scale


@bound
@triton.jit
def _gdn_prepare_kernel(
    QKV, A, B, A_LOG, DT_BIAS, CHUNK_ROW, CHUNK_START, CU, W, U, KD, G, SCORES, CHUNKS,
    stride_t, stride_ab, HK, HV, scale,
    DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr, LEVELS: tl.constexpr,
    PERSISTENT: tl.constexpr,
):  # fmt: skip
    first, h = tl.program_id(0), tl.program_id(1)
    if PERSISTENT:  # a fixed grid narrower than its bound: the programs stride over the chunks
        for chunk in range(first, tl.load(CHUNKS), tl.num_programs(0)):
            _prepare_chunk(
                QKV, A, B, A_LOG, DT_BIAS, CHUNK_ROW, CHUNK_START, CU, W, U, KD, G, SCORES,
                chunk, h, stride_t, stride_ab, HK, HV, scale, DK, DV, C, LEVELS,
            )  # fmt: skip
    else:
        if CHUNKS is not None:  # a fixed grid: programs past the step's chunks (read here) exit
            if first >= tl.load(CHUNKS):
                return
        _prepare_chunk(
            QKV, A, B, A_LOG, DT_BIAS, CHUNK_ROW, CHUNK_START, CU, W, U, KD, G, SCORES, first, h,
            stride_t, stride_ab, HK, HV, scale, DK, DV, C, LEVELS,
        )  # fmt: skip


@triton.jit
def _prepare_chunk(
    QKV, A, B, A_LOG, DT_BIAS, CHUNK_ROW, CHUNK_START, CU, W, U, KD, G, SCORES, chunk, h,
    stride_t, stride_ab, HK, HV, scale,
    DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr, LEVELS: tl.constexpr,
):  # fmt: skip
    """One chunk's W, K', U, gates (and, with SCORES, its intra-chunk scores) for value head h."""
    c0 = tl.load(CHUNK_START + chunk)
    end = tl.load(CU + tl.load(CHUNK_ROW + chunk) + 1)
    hk = h // (HV // HK)
    ci = tl.arange(0, C)
    kd = tl.arange(0, DK)
    vd = tl.arange(0, DV)
    t = c0 + ci
    live = t < end
    k, cum, beta = _chunk_gates_and_keys(
        QKV, A, B, A_LOG, DT_BIAS, h, hk, t, live, stride_t, stride_ab, HK, DK
    )
    v = tl.load(QKV + t[:, None] * stride_t + 2 * HK * DK + h * DV + vd[None, :],
                mask=live[:, None], other=0.0).to(tl.float32)  # fmt: skip
    below = ci[:, None] > ci[None, :]
    causal = ci[:, None] >= ci[None, :]
    decay = tl.where(causal, tl.exp(tl.where(causal, cum[:, None] - cum[None, :], 0.0)), 0.0)
    if SCORES is not None:  # the outputs pass's (q k^T * decay), once for all its value blocks
        q = _chunk_queries(QKV, t, live, hk, stride_t, scale, DK)
        scores = tl.dot(q, tl.trans(k)) * decay
        tl.store(SCORES + ((tl.cast(chunk, tl.int64) * HV + h) * C + ci[:, None]) * C + ci[None, :],
                 scores)  # fmt: skip
    k_beta = k * beta[:, None]
    lower = tl.where(below, tl.dot(k_beta, tl.trans(k), input_precision="tf32") * decay, 0.0)
    inverse = _unit_lower_inverse(lower, tl.minimum(end - c0, C), C, LEVELS)
    w = tl.dot(inverse, k_beta * tl.exp(cum)[:, None], input_precision="tf32")
    u = tl.dot(inverse, v * beta[:, None], input_precision="tf32")
    last = tl.min(tl.where(live, cum, 0.0), axis=0)  # cum falls: its value at the last token
    rows = (t[:, None] * HV + h).to(tl.int64)
    tl.store(W + rows * DK + kd[None, :], w, mask=live[:, None])
    tl.store(KD + rows * DK + kd[None, :], k * tl.exp(last - cum)[:, None], mask=live[:, None])
    tl.store(U + rows * DV + vd[None, :], u, mask=live[:, None])
    tl.store(G + t * HV + h, cum, mask=live)


@triton.jit
def _unit_lower_inverse(lower, count, C: tl.constexpr, LEVELS: tl.constexpr):
    """(I + lower)^-1 for a strictly lower [C, C] tile zero past its first `count` rows and
    columns: `_gdn_chunked_kernel`'s solve by blocks (8x8 by substitution, then doublings)."""
    ci = tl.arange(0, C)
    eye = tl.where(ci[:, None] == ci[None, :], 1.0, 0.0)
    inverse = eye
    diagonal = tl.where((ci // 8)[:, None] == (ci // 8)[None, :], lower, 0.0)
    for j in range(1, tl.minimum(count, 8)):
        settled = eye - tl.dot(diagonal, inverse, input_precision="ieee")
        inverse = tl.where((ci % 8 == j)[:, None], settled, inverse)
    for level in tl.static_range(LEVELS):
        size = 8 << level
        if count > size:
            pair = (ci // (2 * size))[:, None] == (ci // (2 * size))[None, :]
            half = (ci // size) % 2
            off = tl.where(pair & (half[:, None] == 1) & (half[None, :] == 0), lower, 0.0)
            inverse -= tl.dot(
                tl.dot(inverse, off, input_precision="ieee"), inverse, input_precision="ieee"
            )
    return inverse


@bound
@triton.jit(do_not_specialize=_PER_STEP)
def _gdn_states_kernel(
    W, U, KD, G, STATE, H, CU, CACHED, SLOTS, FIRST_CHUNK, ROW0, ROW_RANGE, HV,
    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    PERSISTENT: tl.constexpr,
):  # fmt: skip
    if PERSISTENT:  # a fixed grid narrower than its bound: the programs stride over the rows
        first, end = tl.load(ROW_RANGE), tl.load(ROW_RANGE + 1)
        for row in range(first + tl.program_id(0), end, tl.num_programs(0)):
            _states_row(W, U, KD, G, STATE, H, CU, CACHED, SLOTS, FIRST_CHUNK, row, HV, DK, DV,
                        BV, C)  # fmt: skip
    else:
        row0, past = _first_row(ROW0, ROW_RANGE)
        if past:
            return
        _states_row(W, U, KD, G, STATE, H, CU, CACHED, SLOTS, FIRST_CHUNK,
                    tl.program_id(0) + row0, HV, DK, DV, BV, C)  # fmt: skip


@triton.jit
def _states_row(
    W, U, KD, G, STATE, H, CU, CACHED, SLOTS, FIRST_CHUNK, row, HV,
    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
):  # fmt: skip
    """One row's chunks in order for the program's value head and block: each chunk's state
    stored before it, V' written over U, the final state back to the row's slot."""
    h, start, end, vd, vmask, sptr, state = _row_state_tile(
        STATE, CU, CACHED, SLOTS, row, HV, DK, DV, BV
    )  # state [DK, BV]
    first = tl.load(FIRST_CHUNK + row)
    ci = tl.arange(0, C)
    kd = tl.arange(0, DK)
    for c0 in range(start, end, C):
        chunk = (first + (c0 - start) // C).to(tl.int64)
        tl.store(H + ((chunk * HV + h) * DK + kd[:, None]) * DV + vd[None, :], state,
                 mask=vmask[None, :])  # fmt: skip
        t = c0 + ci
        live = t < end
        rows = (t[:, None] * HV + h).to(tl.int64)
        w = tl.load(W + rows * DK + kd[None, :], mask=live[:, None], other=0.0)
        k_decayed = tl.load(KD + rows * DK + kd[None, :], mask=live[:, None], other=0.0)
        uptr = U + rows * DV + vd[None, :]
        u = tl.load(uptr, mask=live[:, None] & vmask[None, :], other=0.0)
        last = tl.min(tl.load(G + t * HV + h, mask=live, other=0.0), axis=0)
        new_v = u - tl.dot(w, state, input_precision="tf32")
        tl.store(uptr, new_v, mask=live[:, None] & vmask[None, :])
        state = state * tl.exp(last) + tl.dot(tl.trans(k_decayed), new_v, input_precision="tf32")
    tl.store(sptr, state.to(STATE.dtype.element_ty), mask=vmask[None, :])


@bound
@triton.jit
def _gdn_outputs_kernel(
    QKV, A, B, A_LOG, DT_BIAS, CHUNK_ROW, CHUNK_START, CU, U, H, G, SCORES, OUT, CHUNKS,
    stride_t, stride_ab, HK, HV, scale,
    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    PERSISTENT: tl.constexpr,
):  # fmt: skip
    first, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if PERSISTENT:  # a fixed grid narrower than its bound: the programs stride over the chunks
        for chunk in range(first, tl.load(CHUNKS), tl.num_programs(0)):
            _outputs_chunk(
                QKV, A, B, A_LOG, DT_BIAS, CHUNK_ROW, CHUNK_START, CU, U, H, G, SCORES, OUT,
                chunk, h, vb, stride_t, stride_ab, HK, HV, scale, DK, DV, BV, C,
            )  # fmt: skip
    else:
        if CHUNKS is not None:  # a fixed grid: programs past the step's chunks (read here) exit
            if first >= tl.load(CHUNKS):
                return
        _outputs_chunk(
            QKV, A, B, A_LOG, DT_BIAS, CHUNK_ROW, CHUNK_START, CU, U, H, G, SCORES, OUT, first,
            h, vb, stride_t, stride_ab, HK, HV, scale, DK, DV, BV, C,
        )  # fmt: skip


@triton.jit
def _outputs_chunk(
    QKV, A, B, A_LOG, DT_BIAS, CHUNK_ROW, CHUNK_START, CU, U, H, G, SCORES, OUT, chunk, h, vb,
    stride_t, stride_ab, HK, HV, scale,
    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
):  # fmt: skip
    """One chunk's outputs for value head h and value block vb: the intra-chunk scores
    recomputed from q, k and the gates, or with SCORES read where the prepare pass stored them
    (the gates' cumulative sums from G)."""
    c0 = tl.load(CHUNK_START + chunk)
    end = tl.load(CU + tl.load(CHUNK_ROW + chunk) + 1)
    hk = h // (HV // HK)
    ci = tl.arange(0, C)
    kd = tl.arange(0, DK)
    vd = vb * BV + tl.arange(0, BV)
    vmask = vd < DV
    t = c0 + ci
    live = t < end
    if SCORES is None:
        k, cum, _ = _chunk_gates_and_keys(
            QKV, A, B, A_LOG, DT_BIAS, h, hk, t, live, stride_t, stride_ab, HK, DK
        )
    else:
        cum = tl.load(G + t * HV + h, mask=live, other=0.0)
    q = _chunk_queries(QKV, t, live, hk, stride_t, scale, DK)
    if SCORES is None:
        causal = ci[:, None] >= ci[None, :]
        decay = tl.where(causal, tl.exp(tl.where(causal, cum[:, None] - cum[None, :], 0.0)), 0.0)
    chunk64 = tl.cast(chunk, tl.int64)
    state = tl.load(H + ((chunk64 * HV + h) * DK + kd[:, None]) * DV + vd[None, :],
                    mask=vmask[None, :], other=0.0)  # fmt: skip
    rows = (t[:, None] * HV + h).to(tl.int64)
    new_v = tl.load(U + rows * DV + vd[None, :], mask=live[:, None] & vmask[None, :], other=0.0)
    out = tl.dot(q * tl.exp(cum)[:, None], state)
    if SCORES is None:
        out += tl.dot(tl.dot(q, tl.trans(k)) * decay, new_v)
    else:
        out += tl.dot(tl.load(SCORES + ((chunk64 * HV + h) * C + ci[:, None]) * C + ci[None, :]),
                      new_v)  # fmt: skip
    optr = OUT + (t[:, None] * HV + h) * DV + vd[None, :]
    tl.store(optr, out.to(OUT.dtype.element_ty), mask=live[:, None] & vmask[None, :])


def _chunk_tables(meta, chunk: int, row0: int):
    """The chunks of `chunk` tokens of the step's rows from `row0` on, built once a step (the
    first layer) and kept on `meta`: their count, and on the device each chunk's row and
    first token, and each row's first chunk (rows before `row0` have none). Built on the host
    from the rows' lengths (`gdn_tables.chunk_tables`, what the step inputs stage for a
    captured step) and sent in one copy that does not wait for the GPU. Each table starts on
    a 16-byte boundary, whatever the counts: Triton specialises a pointer on that alignment,
    and tables packed end to end would give the kernels a new compile per step shape."""
    kept = getattr(meta, "gdn_chunks", None)
    if kept is not None and kept[0] == (chunk, row0):
        return kept[1]
    chunk_row, chunk_start, first = chunk_tables(np.asarray(meta.num_new), row0, chunk)
    count = len(chunk_row)
    width = -(-max(count, len(first)) // 4) * 4  # int32s: a multiple of 16 bytes
    packed = np.zeros((3, width), dtype=np.int64)
    for i, table in enumerate((chunk_row, chunk_start, first)):
        packed[i, : len(table)] = table
    device = rows_to(packed, torch.int32, meta.cu_seqlens.device)
    tables = (count, device[0, :count], device[1, :count], device[2, : len(first)])
    meta.gdn_chunks = ((chunk, row0), tables)
    return tables


def _split_scratch(meta, shape: tuple[int, ...], like: torch.Tensor) -> tuple:
    """The split kernels' fp32 scratch (W, K', U, the gates, the state before each chunk, and
    with `scores` the intra-chunk scores, else None), allocated at a step's first layer and
    kept on `meta` for the others, whose shapes are the same: every layer's kernels run in
    stream order, so a layer rewrites the scratch only after the previous layer's last kernel
    has read it (5 or 6 allocations a step, not a layer). `shape` = (tokens, value heads, key
    dim, value dim, chunk programs, chunk size, scores)."""
    kept = getattr(meta, "gdn_scratch", None)
    if kept is not None and kept[0] == shape:
        return kept[1]
    tokens, v_heads, k_dim, v_dim, count, chunk, scores = shape
    f32 = dict(dtype=torch.float32, device=like.device)
    w = torch.empty((tokens, v_heads, k_dim), **f32)
    scratch = (
        w,
        torch.empty_like(w),
        torch.empty((tokens, v_heads, v_dim), **f32),
        torch.empty((tokens, v_heads), **f32),
        torch.empty((count, v_heads, k_dim, v_dim), **f32),
        torch.empty((count, v_heads, chunk, chunk), **f32) if scores else None,
    )
    meta.gdn_scratch = (shape, scratch)
    return scratch


def gated_delta_chunked_split(
    qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim,
    split: SplitConfig = SPLIT_DEFAULT, row0: int = 0, out: torch.Tensor | None = None,
):  # fmt: skip
    """`gated_delta_chunked`'s contract in three launches (prepare, states, outputs), whose
    serial part is two tile products a chunk, launched as `split` says (chunk size, value
    blocks, warps, stages, options); `meta` also needs `num_new` (host row lengths).
    Scratch: fp32 W, K', U [T, Hv, K|V] and the state before each chunk [chunks, Hv, K, V]."""
    out = _output(qkv, a.shape[1], v_dim, out)
    if not qkv.shape[0] or row0 == meta.num_rows:
        return out
    count, *tables = _chunk_tables(meta, split.chunk, row0)
    rows = (meta.num_rows - row0, row0, None)
    _split_launches(qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim, split,
                    (count, *tables, None), rows, out)  # fmt: skip
    return out


def _split_launches(
    qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim, split: SplitConfig,
    chunks: tuple, rows: tuple, out: torch.Tensor,
) -> None:  # fmt: skip
    """The split kernel's three launches into `out`: `chunks` = (the chunk programs, each
    chunk's row, its first token, each row's first chunk, the device chunk count or None),
    `rows` = (the row programs, the first row, the device [first, end) rows or None); a device
    count or range makes the grid a bound whose programs past it exit, or, where `split`
    caps the fixed grid's programs, stride over it."""
    count, chunk_row, chunk_start, first, chunk_count = chunks
    row_programs, row0, row_range = rows
    v_heads, chunk = a.shape[1], split.chunk
    shape = (qkv.shape[0], v_heads, k_dim, v_dim, count, chunk, split.scores_in_prepare)
    w, k_decayed, u, g, h, scores = _split_scratch(meta, shape, qkv)
    chunk_cap = split.fixed_chunks if chunk_count is not None else None
    chunk_programs = count if chunk_cap is None else min(count, chunk_cap)
    row_cap = split.fixed_states_rows if row_range is not None else None
    row_programs = row_programs if row_cap is None else min(row_programs, row_cap)
    states_bv = min(split.states_bv, triton.next_power_of_2(v_dim))
    outputs_bv = min(split.outputs_bv, triton.next_power_of_2(v_dim))
    common = dict(DK=k_dim, DV=v_dim, C=chunk)
    # what only the scores option reads, None without it (a None argument is a constexpr: the
    # kernels compile as they did before the option)
    scale, scores_g = (k_dim**-0.5, g) if scores is not None else (None, None)
    _gdn_prepare_kernel[(chunk_programs, v_heads)](
        qkv, a, b, A_log, dt_bias, chunk_row, chunk_start, meta.cu_seqlens, w, u, k_decayed, g,
        scores, chunk_count, qkv.stride(0), a.stride(0), k_heads, v_heads, scale,
        LEVELS=_doublings(chunk), PERSISTENT=chunk_cap is not None, **common,
        **split.launch("prepare"),
    )  # fmt: skip
    _gdn_states_kernel[(row_programs, v_heads, triton.cdiv(v_dim, states_bv))](
        w, u, k_decayed, g, ssm_state, h, meta.cu_seqlens, meta.cached, meta.state_slots, first,
        row0, row_range, v_heads, BV=states_bv, PERSISTENT=row_cap is not None, **common,
        **split.launch("states"),
    )  # fmt: skip
    _gdn_outputs_kernel[(chunk_programs, v_heads, triton.cdiv(v_dim, outputs_bv))](
        qkv, a, b, A_log, dt_bias, chunk_row, chunk_start, meta.cu_seqlens, u, h, scores_g,
        scores, out, chunk_count, qkv.stride(0), a.stride(0), k_heads, v_heads, k_dim**-0.5,
        BV=outputs_bv, PERSISTENT=chunk_cap is not None, **common, **split.launch("outputs"),
    )  # fmt: skip


PREFILL_KINDS = ("triton", "triton_split", "auto")


def _one_token_rows(meta) -> int:
    """How many of the step's leading rows have one new token (the scheduler puts decode rows
    first), counted once a step and kept on `meta` (`gdn_one_token_rows`)."""
    kept = getattr(meta, "gdn_one_token_rows", None)
    if kept is None:
        kept = one_token_prefix(np.asarray(meta.num_new))
        meta.gdn_one_token_rows = kept
    return kept


def gated_delta_prefill(
    kind: str, qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim,
    split: SplitConfig = SPLIT_DEFAULT, split_from: int = SPLIT_FROM_TOKENS,
    pipelined: bool = False,
) -> torch.Tensor:  # fmt: skip
    """`gated_delta_recurrent`'s contract for a prefill or mixed step: the leading rows of one
    new token (a mixed step's decode rows) through the recurrence (`pipelined`: its
    persistent, pipelined form), which costs them a token's work instead of a whole chunk's
    program, and the rest through the chunked kernel `kind` (PREFILL_KINDS; `auto`: the split
    one when the longest row is `split_from` tokens or more; the split one launched as `split`
    says), both writing into one output. Rows of one token later in the batch stay chunked."""
    if kind not in PREFILL_KINDS:
        raise ValueError(f"kind must be one of {', '.join(PREFILL_KINDS)}, got {kind!r}")
    args = (qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim)
    single = _one_token_rows(meta)
    out = gated_delta_recurrent(*args, rows=single, pipelined=pipelined)
    if single == meta.num_rows:
        return out
    if kind == "auto":
        long = max(meta.num_new[single:]) >= split_from
        kind = "triton_split" if long else "triton"
    if kind == "triton_split":
        return gated_delta_chunked_split(*args, split=split, row0=single, out=out)
    return gated_delta_chunked(*args, row0=single, out=out)


def gated_delta_fixed_grid(
    qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim,
    split: SplitConfig = SPLIT_DEFAULT,
) -> torch.Tensor:  # fmt: skip
    """`gated_delta_prefill`'s result for a step padded to a token bucket whose tables the step
    inputs staged (`meta.gdn_tables`), on grids set by the token count alone: the leading
    one-token rows through the recurrence, the rest through the split kernel (launched as
    `split` says; its chunk must be the tables'), every count and table read from the device
    at the staged (fixed) addresses. A launch's grid and its other arguments are the same for
    every step of the bucket, so one CUDA graph serves them all. Padding tokens' outputs are 0."""
    staged = meta.gdn_tables
    if split.chunk != staged.chunk:
        raise ValueError(f"split chunk {split.chunk} is not the staged tables' {staged.chunk}")
    tokens = qkv.shape[0]
    out = qkv.new_zeros((tokens, a.shape[1], v_dim))
    if not tokens:
        return out
    rows = staged.row_bound(tokens)
    counts = staged.counts  # [0, the leading one-token rows, rows, chunks]
    cap = split.fixed_recurrent_rows
    _launch(
        _gdn_recurrent_kernel, qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim,
        v_dim, 0, rows if cap is None else min(rows, cap), out, row_range=counts,
        bv=RECURRENT_BV, num_warps=RECURRENT_WARPS, PERSISTENT=cap is not None,
        ONE_PASS=RECURRENT_ONE_PASS,
    )  # fmt: skip
    chunks = (max_chunks(tokens, rows, staged.chunk), staged.chunk_row, staged.chunk_start,
              staged.first_chunk, counts[3:])  # fmt: skip
    _split_launches(qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim, split,
                    chunks, (rows, 0, counts[1:]), out)  # fmt: skip
    return out
