"""The gated delta rule token by token on Triton, in place on the state pool: per (row, value
head, value block) the gates, q/k l2 norm and scale computed in the kernel, the fp32 state
read from and written back to the row's slot. The decode step (one token a row), exact fp32
prefill, and a mixed step's leading one-token rows (`gated_delta_recurrent`); on a grid fixed
by a token bucket (`recurrent_fixed_grid`); or, with `engine.gdn_decode: pipelined`, rows of
one token on a persistent kernel that streams each tile's state in ahead of its use. How each
launches: gdn_launch.py."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.gdn_launch import (
    PIPELINED_LAUNCH,
    RECURRENT_LAUNCH,
    PipelinedLaunch,
    RecurrentLaunch,
)
from engine.kernels.triton_gdn_rows import (
    PER_STEP,
    first_row,
    launch_rows,
    output_for,
    row_state_tile,
)
from engine.kernels.triton_launch import bound
from engine.kernels.triton_pdl import pdl_start


@bound
@triton.jit(do_not_specialize=PER_STEP)
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
        row0, past = first_row(ROW0, ROW_RANGE)
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
    h, start, end, vd, vmask, sptr, state = row_state_tile(
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


def gated_delta_recurrent(
    qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim,
    row0: int = 0, rows: int | None = None, out: torch.Tensor | None = None,
    pipelined: bool = False, launch: RecurrentLaunch = RECURRENT_LAUNCH,
    pipelined_launch: PipelinedLaunch = PIPELINED_LAUNCH,
):  # fmt: skip
    """qkv [T, 2*Hk*K + Hv*V] (the conv's output, [q | k | v]); a, b [T, Hv] (rows may be
    strided). Returns o [T, Hv, V] in qkv's dtype; each row's slot of ssm_state is updated.
    `rows` rows from `row0` (default: every row from `row0` on) run, their tokens written into
    `out` where given (the other rows' tokens are left as they are). `pipelined`: every row
    has one token and starts at row 0 (a decode step's, a mixed step's leading rows): the
    persistent, pipelined kernel (`engine.gdn_decode: pipelined`) runs them, launched as
    `pipelined_launch` says; else the grid kernel, as `launch` says."""
    if pipelined:
        if row0:
            raise ValueError(f"the pipelined recurrence runs rows from 0, got row0={row0}")
        return _decode_pipelined(
            qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim, rows, out,
            launch.one_pass, pipelined_launch,
        )  # fmt: skip
    return launch_rows(
        _gdn_recurrent_kernel, qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim,
        row0, rows, out, bv=launch.bv, num_warps=launch.warps, PERSISTENT=False,
        ONE_PASS=launch.one_pass,
    )  # fmt: skip


def recurrent_fixed_grid(
    qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim, rows: int, row_range,
    out: torch.Tensor, persistent: bool, launch: RecurrentLaunch = RECURRENT_LAUNCH,
) -> None:  # fmt: skip
    """The recurrence into `out` on a fixed grid of `rows` row programs for the rows [first,
    end) of the device pair `row_range`: those past `end` exit, or (`persistent`) the
    programs stride over them."""
    launch_rows(
        _gdn_recurrent_kernel, qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim,
        v_dim, 0, rows, out, row_range=row_range, bv=launch.bv, num_warps=launch.warps,
        PERSISTENT=persistent, ONE_PASS=launch.one_pass,
    )  # fmt: skip


def _decode_pipelined(
    qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim, rows, out,
    one_pass: bool, launch: PipelinedLaunch,
) -> torch.Tensor:  # fmt: skip
    """`gated_delta_recurrent` on `rows` one-token rows from row 0, on `launch.programs(tiles)`
    programs: a grid set by the row count alone (a decode graph's bucket)."""
    v_heads = a.shape[1]
    out = output_for(qkv, v_heads, v_dim, out)
    rows = meta.num_rows if rows is None else rows
    bv = min(launch.bv, triton.next_power_of_2(v_dim))
    tiles = rows * v_heads * triton.cdiv(v_dim, bv)
    if qkv.shape[0] and tiles:
        _gdn_decode_pipelined_kernel[(launch.programs(tiles),)](
            qkv, a, b, A_log, dt_bias, ssm_state, out, meta.cu_seqlens, meta.cached,
            meta.state_slots, tiles, qkv.stride(0), a.stride(0), k_heads, v_heads, k_dim**-0.5,
            DK=k_dim, DV=v_dim, BV=bv, STAGES=launch.stages, ONE_PASS=one_pass,
            num_warps=launch.warps,
        )  # fmt: skip
    return out
