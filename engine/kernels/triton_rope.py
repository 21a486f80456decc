"""Triton kernels for an attention layer's inputs: each head of q and k normed (Qwen3.5's
q/k norms) and rotated (partial neox rotary; Llama's heads the rotary alone), in one launch
(`qk_rope`), and the step's K and V into the paged cache (`store_kv`, or with `kv=` in that
same launch).

Each rounds where the torch reference (engine/layers) rounds: the fp32 kernels equal it to
float rounding, the bf16 ones to bf16 rounding (the normed head rounded before it is rotated).
Inputs may be strided views along the token and head axes (the split outputs of a packed
projection); the last axis must be contiguous.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from engine.kernels.triton_launch import bound
from engine.kernels.triton_pdl import pdl_start


class KvStore(NamedTuple):
    """Where `qk_rope` also stores a decode step's K (rotated) and V: flat slot
    `slots[t]` of the [pages, page_size, kv_heads, head_dim] caches (none where negative)."""

    v: torch.Tensor  # [T, kv_heads, head_dim], rows may be strided
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slots: torch.Tensor  # [T] int


@triton.jit
def _norm_rope_head(
    base, out, W, COS, SIN, t, D, HALF, eps, HAS_NORM: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    """One head at `base` (token t) normed (HAS_NORM) then rotated, stored at `out` and
    returned (fp32 [BLOCK])."""
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    # Neox rotation of the first 2 * HALF dims: the partner of i is i +- HALF.
    rotated = cols < 2 * HALF
    first = cols < HALF
    partner = tl.where(first, cols + HALF, cols - HALF)
    pmask = mask & rotated
    y = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
    yp = tl.load(base + partner, mask=pmask, other=0.0).to(tl.float32)
    if HAS_NORM:  # the reference rounds the normed head before rotating it
        inv = 1.0 / tl.sqrt(tl.sum(y * y, axis=0) / D + eps)
        y = (y * inv * tl.load(W + cols, mask=mask, other=0.0)).to(out.dtype.element_ty)
        y = y.to(tl.float32)
        yp = (yp * inv * tl.load(W + partner, mask=pmask, other=0.0)).to(out.dtype.element_ty)
        yp = yp.to(tl.float32)
    freq = tl.where(first, cols, cols - HALF)
    cos = tl.load(COS + t * HALF + freq, mask=pmask, other=1.0)
    sin = tl.load(SIN + t * HALF + freq, mask=pmask, other=0.0)
    rope = tl.where(rotated, tl.where(first, y * cos - yp * sin, y * cos + yp * sin), y)
    tl.store(out + cols, rope.to(out.dtype.element_ty), mask=mask)
    return rope


@bound
@triton.jit
def _head_norm_rope_kernel(
    X, OUT, W, X2, OUT2, W2, COS, SIN, V, KC, VC, SLOTS, stride_xt, stride_xh, stride_x2t,
    stride_x2h, stride_vt, stride_vh, H, H2, D, HALF, eps, eps2, HAS_NORM: tl.constexpr,
    BLOCK: tl.constexpr, STORE: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """Program (token, head) over H heads of X, then H2 of X2 (an attention layer's q and k:
    one launch), each by the same code; with STORE, then H2 heads of V, and each rotated K
    head and each V head also stored at its token's cache slot (none where it is negative)."""
    pdl_start(PDL)
    pid = tl.program_id(0)
    heads = H + H2 + (H2 if STORE else 0)
    t, h = pid // heads, pid % heads
    if h < H:
        _norm_rope_head(X + t * stride_xt + h * stride_xh, OUT + (t * H + h) * D, W, COS, SIN,
                        t, D, HALF, eps, HAS_NORM, BLOCK)  # fmt: skip
    elif h < H + H2:
        h2 = h - H
        k = _norm_rope_head(X2 + t * stride_x2t + h2 * stride_x2h, OUT2 + (t * H2 + h2) * D, W2,
                            COS, SIN, t, D, HALF, eps2, HAS_NORM, BLOCK)  # fmt: skip
        if STORE:  # the constexpr keeps the caches' None pointers out of a plain compile
            _to_slot(KC, SLOTS, t, h2, H2, D, k.to(KC.dtype.element_ty), BLOCK)
    elif STORE:
        hv = h - H - H2
        cols = tl.arange(0, BLOCK)
        v = tl.load(V + t * stride_vt + hv * stride_vh + cols, mask=cols < D)
        _to_slot(VC, SLOTS, t, hv, H2, D, v, BLOCK)


@triton.jit
def _to_slot(CACHE, SLOTS, t, h, H2, D, head, BLOCK: tl.constexpr):
    """Head h of token t's K or V into its cache slot (none where the slot is negative: a
    padding token)."""
    cols = tl.arange(0, BLOCK)
    slot = tl.load(SLOTS + t).to(tl.int64)
    tl.store(CACHE + slot * (H2 * D) + h * D + cols, head, mask=(cols < D) & (slot >= 0))


def head_norm_rope(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
) -> torch.Tensor:
    """Per-head RMS norm (fp32 weight, scale applied) then neox rotary of the first
    2 * cos.shape[1] dims. x [T, H, D], a view whose last axis is contiguous; cos/sin fp32
    [T, rotary_dim / 2]. Returns a contiguous [T, H, D] in x's dtype."""
    return _heads(x, None, weight, None, cos, sin, eps, 0.0)[0]


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox rotary of the first 2 * cos.shape[1] dims of each head, in fp32, rounded once
    (engine/layers/rotary.py's `apply_rotary`; Llama's q and k); the other dims pass through.
    x [T, H, D] as for `head_norm_rope`. Returns a contiguous [T, H, D] in x's dtype."""
    return _heads(x, None, None, None, cos, sin, 0.0, 0.0)[0]


def qk_rope(
    q, k, q_weight, k_weight, cos, sin, q_eps: float = 0.0, k_eps: float = 0.0,
    kv: KvStore | None = None,
):  # fmt: skip
    """An attention layer's q [T, Hq, D] and k [T, Hk, D] (views as for `head_norm_rope`)
    each head normed by its weight (both given: Qwen3.5's q/k norms; both None: Llama's rotary
    alone) then rotated, in one launch: (q, k), each head's bits those of `head_norm_rope` /
    `rope` of it alone. With `kv`, the rotated k and kv.v also stored as `store_kv` stores
    them, in the same launch."""
    return _heads(q, k, q_weight, k_weight, cos, sin, q_eps, k_eps, kv)


def _heads(x, x2, weight, weight2, cos, sin, eps: float, eps2: float, kv=None) -> tuple:
    tokens, heads, dim = x.shape
    out = torch.empty((tokens, heads, dim), dtype=x.dtype, device=x.device)
    second = x if x2 is None else x2
    heads2 = 0 if x2 is None else x2.shape[1]
    out2 = out if x2 is None else torch.empty_like(x2, memory_format=torch.contiguous_format)
    if x2 is not None and (
        x2.shape[0] != tokens or x2.shape[2] != dim or (weight is None) != (weight2 is None)
    ):
        raise ValueError(
            f"qk_rope: q {tuple(x.shape)} and k {tuple(x2.shape)}, both normed or neither"
        )
    if kv is not None and (x2 is None or kv.v.shape != x2.shape
                           or kv.k_cache.shape[2:] != (heads2, dim)):  # fmt: skip
        raise ValueError(f"qk_rope: v {tuple(kv.v.shape)} and the caches do not fit k")
    v = second if kv is None else kv.v
    caches = (None, None, None) if kv is None else (kv.k_cache, kv.v_cache, kv.slots)
    if tokens:
        _head_norm_rope_kernel[(tokens * (heads + heads2 * (1 if kv is None else 2)),)](
            x, out, x if weight is None else weight, second, out2,
            x if weight2 is None else weight2, cos, sin, v, *caches, x.stride(0), x.stride(1),
            second.stride(0), second.stride(1), v.stride(0), v.stride(1), heads, heads2, dim,
            cos.shape[1], eps, eps2, HAS_NORM=weight is not None,
            BLOCK=triton.next_power_of_2(dim), STORE=kv is not None,
        )  # fmt: skip
    return out, out2


@bound
@triton.jit
def _store_kv_kernel(
    K, V, KC, VC, SLOT, stride_kt, stride_vt, N, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    pdl_start(PDL)
    t = tl.program_id(0)
    slot = tl.load(SLOT + t).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = (cols < N) & (slot >= 0)  # a negative slot is a padding token: nothing stored
    k = tl.load(K + t * stride_kt + cols, mask=mask)
    v = tl.load(V + t * stride_vt + cols, mask=mask)
    tl.store(KC + slot * N + cols, k, mask=mask)
    tl.store(VC + slot * N + cols, v, mask=mask)


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """One launch per layer: token t's K and V ([T, kv_heads * head_dim] views) go to flat slot
    slot_mapping[t] of the [pages, page_size, kv_heads, head_dim] caches."""
    tokens = k.shape[0]
    n = k_cache.shape[2] * k_cache.shape[3]
    if tokens:
        _store_kv_kernel[(tokens,)](
            k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0), n,
            BLOCK=triton.next_power_of_2(n),
        )  # fmt: skip
