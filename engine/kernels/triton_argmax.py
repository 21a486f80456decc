"""The greedy choice of a decode step on the GPU: each row's argmax over the vocabulary.

torch's `argmax(-1)` over a decode graph's [64, 248,320] bf16 logits took 33 us on the H200
(one reduction kernel, a block a row: 64 blocks for 132 SMs), where reading the 32 MB once
takes ~7 us. Here each row's columns are cut into parts of `SPLIT` and each (row, part) is a
program (61 parts a row at 0.8b's vocabulary: ~3,900 programs), then one program a row picks
among its parts. Ties go to the first column holding the maximum, as torch's does: within a
block `tl.max`'s leftmost index, across blocks and parts only a strictly larger value moves
the choice. The logits must be free of NaN (torch would pick a NaN; these never hold one);
a row of -inf picks column 0, as torch does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton_launch import bound
from engine.kernels.triton_pdl import pdl_start

SPLIT = 4096  # columns a program reduces
BLOCK = 1024  # columns a program loads at once


@bound
@triton.jit
def _argmax_parts_kernel(
    X, VAL, IDX, stride_x, n, parts, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_start(PDL)
    row, part = tl.program_id(0), tl.program_id(1)
    start = part * SPLIT
    best = tl.full([], float("-inf"), tl.float32)
    at = tl.full([], 0, tl.int32)
    for offset in tl.static_range(0, SPLIT, BLOCK):
        cols = start + offset + tl.arange(0, BLOCK)
        x = tl.load(X + row * stride_x + cols, mask=cols < n, other=float("-inf")).to(tl.float32)
        value, index = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        larger = value > best  # an equal maximum further right never moves the choice
        at = tl.where(larger, start + offset + index, at)
        best = tl.where(larger, value, best)
    tl.store(VAL + row * parts + part, best)
    tl.store(IDX + row * parts + part, at)


@bound
@triton.jit
def _argmax_pick_kernel(VAL, IDX, OUT, parts, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_start(PDL)
    row = tl.program_id(0)
    p = tl.arange(0, BLOCK)
    live = p < parts
    value = tl.load(VAL + row * parts + p, mask=live, other=float("-inf"))
    index = tl.load(IDX + row * parts + p, mask=live, other=0)
    best = tl.max(value, axis=0)
    first = tl.min(tl.where(live & (value == best), p, BLOCK), axis=0)  # the leftmost part
    tl.store(OUT + row, tl.sum(tl.where(p == first, index, 0), axis=0).to(tl.int64))


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [R, V] (the last axis contiguous) -> [R] int64, each row's first maximum."""
    rows, n = logits.shape
    parts = triton.cdiv(n, SPLIT)
    values = torch.empty((rows, parts), dtype=torch.float32, device=logits.device)
    indices = torch.empty((rows, parts), dtype=torch.int32, device=logits.device)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows:
        _argmax_parts_kernel[(rows, parts)](
            logits, values, indices, logits.stride(0), n, parts, SPLIT=SPLIT, BLOCK=BLOCK
        )
        _argmax_pick_kernel[(rows,)](
            values, indices, out, parts, BLOCK=max(16, triton.next_power_of_2(parts))
        )
    return out
