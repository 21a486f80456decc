"""Paged GQA decode attention, one query token a row, split over each row's tokens
("flash-decoding"): `engine.decode_attention: triton`.

Why: on the H200 FlashInfer's decode inside our CUDA graphs reads the cache well below HBM
bandwidth. Orpheus 3b (24 query heads over 8 KV heads, head dim 128) at 64 rows of 256
tokens: its tensor-core decode takes 37.4 us a layer for 67 MB of K and V (1.8 TB/s of ~4.8),
plus 3.4 us of its merge kernel, which every row goes through in graph mode (FlashInfer's
scheduler forces split-KV when planned for CUDA graphs, even for rows of one chunk). 0.8b (8
over 2, head dim 256) at 64 rows of 512, CUDA-core decode: 40 us a layer for 67 MB too (1.7
TB/s; 34 MB is K or V alone). A decode step's attention is a pure read of the cache: it should
run near bandwidth.

Two launches (the second only with splits > 1):

1. `_decode_kernel`, grid (rows, kv_heads, splits): a program takes one row, one KV head and
   every query head of its group (padded to 16 rows, tl.dot's smallest), so each K/V byte is
   read once for the whole group. It reads the row's length on the device (pages from
   `kv_indptr`, `kv_last_page_len` tokens in the last), takes its split's tokens (a split is
   ceil(length / splits) rounded up to whole tiles: a short row leaves the last splits
   empty), and walks them a tile of `block_n` tokens at a time: each token's page id from
   `kv_indices`, the K tile [block_n, head_dim], the scores by tl.dot, an online softmax in
   fp32 in base 2 (scale x log2(e) folded into the scores), the V tile into the fp32 sum.
   With one split it stores the normalised output in q's dtype; with more, each split's
   normalised output and its log-sum-exp (base 2; -inf for an empty split) in fp32.
2. `_merge_kernel`, grid (rows, q_heads): the splits weighted by exp2(lse - max lse), an
   empty split by 0 (its output is never written, never read), stored in q's dtype.

The grid depends on the rows, the heads and the split count, and `decode_splits` takes the
split count from the rows and heads alone: a step padded to a graph bucket launches the same
grid whatever its lengths, every per-step value read on the device (INVARIANTS 58). The
result depends on nothing but the inputs and the split count (no atomics, no autotuning;
splits merge in order). Tiles, warps and stages by head dim: decode_config.py.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from engine.kernels.decode_config import DecodeLaunch, decode_splits, launch_for
from engine.kernels.triton_launch import bound
from engine.kernels.triton_pdl import pdl_start

MERGE_WARPS = 4  # the merge reads splits x head_dim fp32 a program: a few KiB


@bound
@triton.jit
def _decode_kernel(
    Q, K, V, KV_INDICES, KV_INDPTR, LAST_LEN, OUT, PART_O, PART_LSE,
    stride_qr, stride_qh, stride_kp, stride_kt, stride_kh, stride_or, stride_oh, qk_scale,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Program (row, KV head, split): the group's queries over the split's tokens."""
    pdl_start(PDL)
    row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    first_page = tl.load(KV_INDPTR + row)
    pages = tl.load(KV_INDPTR + row + 1) - first_page
    length = (pages - 1) * PAGE + tl.load(LAST_LEN + row)
    per_split = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK_N) * BLOCK_N  # whole tiles
    start = split * per_split
    end = tl.minimum(start + per_split, length)

    group = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + group
    in_group = (group < GROUP)[:, None]
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        Q + row * stride_qr + heads[:, None] * stride_qh + dims[None, :], mask=in_group, other=0.0
    )
    best = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max of the base-2 scores
    total = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp2(score - best)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    tokens = start + tl.arange(0, BLOCK_N)
    # Each tile's page ids are loaded a tile ahead, so K and V's addresses come from values
    # the loop carries, not from a load of the same iteration: Triton's pipeliner then keeps
    # num_stages - 1 tiles of K and V in flight (with the ids loaded in the iteration that
    # reads them it kept one at every num_stages below 5: the sm_90 compile's shared memory).
    page = tl.load(KV_INDICES + first_page + tokens // PAGE, mask=tokens < end, other=0)
    for _ in range(start, end, BLOCK_N):
        live = tokens < end
        at = page.to(tl.int64) * stride_kp + (tokens % PAGE) * stride_kt + kv_head * stride_kh
        tokens += BLOCK_N
        page = tl.load(KV_INDICES + first_page + tokens // PAGE, mask=tokens < end, other=0)
        kv_at = at[:, None] + dims[None, :]
        k = tl.load(K + kv_at, mask=live[:, None], other=0.0)
        v = tl.load(V + kv_at, mask=live[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        scores = tl.where(live[None, :], scores, float("-inf"))
        # every tile walked holds a live token: the new maximum is finite
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        p = tl.exp2(scores - new_best[:, None])
        shrink = tl.exp2(best - new_best)  # 0 at the first tile (best -inf)
        total = total * shrink + tl.sum(p, axis=1)
        acc = acc * shrink[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        best = new_best

    seen = total > 0  # no tokens: an empty split (or a row of none, never staged)
    total = tl.where(seen, total, 1.0)
    out = acc / total[:, None]  # zeros without tokens
    if SPLITS == 1:
        at_out = OUT + row * stride_or + heads[:, None] * stride_oh + dims[None, :]
        tl.store(at_out, out.to(OUT.dtype.element_ty), mask=in_group)
    else:
        part = (row * SPLITS + split) * (tl.num_programs(1) * GROUP) + heads  # [R, S, Hq]
        lse = tl.where(seen, best + tl.log2(total), float("-inf"))
        tl.store(PART_LSE + part, lse, mask=group < GROUP)
        nonempty = in_group & (start < end)
        tl.store(PART_O + part[:, None] * HEAD_DIM + dims[None, :], out, mask=nonempty)


@bound
@triton.jit
def _merge_kernel(
    PART_O, PART_LSE, OUT, stride_or, stride_oh,
    HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Program (row, query head): its splits' outputs weighted by their share of the softmax."""
    pdl_start(PDL)
    row, head = tl.program_id(0), tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    part = (row * SPLITS + splits) * tl.num_programs(1) + head
    lse = tl.load(PART_LSE + part, mask=splits < SPLITS, other=float("-inf"))
    live = lse > float("-inf")
    top = tl.max(lse, axis=0)
    weight = tl.where(live, tl.exp2(lse - top), 0.0)
    dims = tl.arange(0, HEAD_DIM)
    outs = tl.load(PART_O + part[:, None] * HEAD_DIM + dims[None, :], mask=live[:, None], other=0.0)
    norm = tl.sum(weight, axis=0)
    out = tl.sum(weight[:, None] * outs, axis=0) / tl.where(norm > 0, norm, 1.0)
    tl.store(OUT + row * stride_or + head * stride_oh + dims, out.to(OUT.dtype.element_ty))


def paged_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, scale: float,
    splits: int | None = None, launch: DecodeLaunch | None = None,
) -> torch.Tensor:  # fmt: skip
    """q [R, q_heads, head_dim] (one query a row; rows may be strided, the last axis
    contiguous) over the paged cache (k_cache, v_cache [pages, page_size, kv_heads,
    head_dim], FlashInfer's NHD) -> [R, q_heads, head_dim] in q's dtype. Row r reads the
    pages kv_indices[kv_indptr[r]:kv_indptr[r + 1]], the last holding kv_last_page_len[r]
    tokens (int32, on q's device). Query head h reads KV head h // (q_heads / kv_heads).
    `splits`: each row's tokens cut into this many parts (default `decode_splits` of the rows
    and KV heads); `launch`: the first kernel's tile, warps and stages (default by head dim)."""
    rows, q_heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    if (
        q_heads % kv_heads or head_dim < 16 or head_dim & (head_dim - 1)
        or k_cache.shape[-1] != head_dim or v_cache.stride() != k_cache.stride()
        or k_cache.stride(-1) != 1 or kv_indptr.shape[0] != rows + 1
    ):  # fmt: skip
        raise ValueError(
            f"paged_decode: q {tuple(q.shape)}, cache {tuple(k_cache.shape)} strides "
            f"{k_cache.stride()} / {v_cache.stride()}, {kv_indptr.shape[0]} indptr entries"
        )
    out = torch.empty((rows, q_heads, head_dim), dtype=q.dtype, device=q.device)
    if rows == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    splits = decode_splits(rows, kv_heads) if splits is None else splits
    launch = launch or launch_for(head_dim)
    group = q_heads // kv_heads
    part_o = part_lse = out  # unused with one split (a constexpr branch)
    if splits > 1:
        f32 = {"dtype": torch.float32, "device": q.device}
        part_o = torch.empty((rows, splits, q_heads, head_dim), **f32)
        part_lse = torch.empty((rows, splits, q_heads), **f32)
    _decode_kernel[(rows, kv_heads, splits)](
        q, k_cache, v_cache, kv_indices, kv_indptr, kv_last_page_len, out, part_o, part_lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), scale * math.log2(math.e),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE=page_size, BLOCK_N=launch.block_n, SPLITS=splits,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=launch.warps, num_stages=launch.stages,
    )  # fmt: skip
    if splits > 1:
        _merge_kernel[(rows, q_heads)](
            part_o, part_lse, out, out.stride(0), out.stride(1), HEAD_DIM=head_dim,
            SPLITS=splits, SPLITS_PAD=triton.next_power_of_2(splits), num_warps=MERGE_WARPS,
        )  # fmt: skip
    return out
