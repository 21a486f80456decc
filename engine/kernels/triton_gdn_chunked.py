"""The gated delta rule a chunk of C tokens at a time on Triton (`gated_delta_chunked`): the WY
form of engine/layers/gated_delta.py's `torch_gated_delta_rule_chunked`, one launch per layer
whatever the rows. Per (row, value head, value block) a loop over the row's chunks, each a few
tile products, the triangular solve among them by blocks (`unit_lower_inverse`: 7
substitution steps on the 8x8 diagonal blocks at once, then log2(C/8) block doublings), the
state carried in registers from chunk to chunk. The grid depends on the row count alone, so a
prefill step pays one launch where flash-linear-attention's chunked kernel pays about nine and
its wrappers."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton_gdn_rows import PER_STEP, first_row, launch_rows, row_state_tile
from engine.kernels.triton_launch import bound


@bound
@triton.jit(do_not_specialize=PER_STEP)
def _gdn_chunked_kernel(
    QKV, A, B, A_LOG, DT_BIAS, STATE, OUT, CU, CACHED, SLOTS,
    ROW0, ROW_RANGE, stride_t, stride_ab, HK, HV, scale,
    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    LEVELS: tl.constexpr,
):  # fmt: skip
    row0, past = first_row(ROW0, ROW_RANGE)
    if past:
        return
    h, start, end, vd, vmask, sptr, state = row_state_tile(
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
        inverse = unit_lower_inverse(lower, tl.minimum(end - c0, C), C, LEVELS)
        u = tl.dot(inverse, u, input_precision="ieee")
        out = tl.dot(q * tl.exp(cum)[:, None], state)
        out += tl.dot(tl.dot(q, tl.trans(k)) * decay, u)
        optr = OUT + (t[:, None] * HV + h) * DV + vd[None, :]
        tl.store(optr, out.to(OUT.dtype.element_ty), mask=live[:, None] & vmask[None, :])
        state = state * tl.exp(last) + tl.dot(tl.trans(k * tl.exp(last - cum)[:, None]), u)
    tl.store(sptr, state.to(STATE.dtype.element_ty), mask=vmask[None, :])


def doublings(chunk: int) -> int:
    """The block doublings of `unit_lower_inverse` from its 8x8 blocks up to a chunk; the
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
    levels = doublings(chunk)
    return launch_rows(
        _gdn_chunked_kernel, qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim,
        row0, None, out, C=chunk, LEVELS=levels,
    )  # fmt: skip


@triton.jit
def unit_lower_inverse(lower, count, C: tl.constexpr, LEVELS: tl.constexpr):
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
