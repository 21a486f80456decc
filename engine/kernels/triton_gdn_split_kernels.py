"""The split Gated DeltaNet kernel's three Triton kernels (prepare, states, outputs): the chunked
rule of triton_gdn_chunked.py in three launches whose serial part is two tile products a chunk.
Launched by triton_gdn_split.py, as a `SplitConfig` says."""

from __future__ import annotations

import triton
import triton.language as tl

from engine.kernels.triton_gdn_chunked import unit_lower_inverse
from engine.kernels.triton_gdn_rows import PER_STEP, first_row, row_state_tile
from engine.kernels.triton_launch import bound

# The chunked rule split in three launches, as flash-linear-attention splits it: the chunks'
# factors in parallel, a short serial pass over the states, the outputs in parallel. Per chunk
# of C tokens, with T = (I + L)^-1 (see triton_gdn_chunked.py):
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
    inverse = unit_lower_inverse(lower, tl.minimum(end - c0, C), C, LEVELS)
    w = tl.dot(inverse, k_beta * tl.exp(cum)[:, None], input_precision="tf32")
    u = tl.dot(inverse, v * beta[:, None], input_precision="tf32")
    last = tl.min(tl.where(live, cum, 0.0), axis=0)  # cum falls: its value at the last token
    rows = (t[:, None] * HV + h).to(tl.int64)
    tl.store(W + rows * DK + kd[None, :], w, mask=live[:, None])
    tl.store(KD + rows * DK + kd[None, :], k * tl.exp(last - cum)[:, None], mask=live[:, None])
    tl.store(U + rows * DV + vd[None, :], u, mask=live[:, None])
    tl.store(G + t * HV + h, cum, mask=live)


@bound
@triton.jit(do_not_specialize=PER_STEP)
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
        row0, past = first_row(ROW0, ROW_RANGE)
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
    h, start, end, vd, vmask, sptr, state = row_state_tile(
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
