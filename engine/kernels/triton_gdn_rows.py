"""What every row program of the Gated DeltaNet kernels shares (triton_gdn_recurrent.py,
triton_gdn_chunked.py, triton_gdn_split_kernels.py): a program's first row on a host-sized or
fixed grid (`first_row`), its head, value block and fp32 state tile read from the row's slot
(`row_state_tile`), and on the host the output and the launch of a program per (row, value
head, value block) (`launch_rows`). Recurrent state [slots, heads, k_dim, v_dim]: fp32, or
bf16 with engine.state_dtype (read into fp32, rounded back on the store)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def first_row(ROW0, ROW_RANGE):
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
def row_state_tile(
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
# server's first minutes then run at a few hundred tok/s). See triton_gdn_split.py's
# `_chunk_tables` too.
PER_STEP = ["ROW0"]


def output_for(qkv, v_heads: int, v_dim: int, out: torch.Tensor | None) -> torch.Tensor:
    """`out`, or where None a new [T, Hv, V] output in qkv's dtype."""
    if out is None:
        out = torch.empty((qkv.shape[0], v_heads, v_dim), dtype=qkv.dtype, device=qkv.device)
    return out


def launch_rows(
    kernel, qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim,
    row0: int, rows: int | None, out: torch.Tensor | None, row_range=None, bv: int = 32,
    num_warps: int = 4, **const,
):  # fmt: skip
    """One launch of a Gated DeltaNet kernel: a program per (row, value head, value block of
    `bv` columns) for `rows` rows from `row0`; with `row_range` (a device [first, end) pair),
    `rows` programs for the rows from `first`, those past `end` exiting (a fixed grid)."""
    v_heads = a.shape[1]
    out = output_for(qkv, v_heads, v_dim, out)
    rows = meta.num_rows - row0 if rows is None else rows
    bv = min(bv, triton.next_power_of_2(v_dim))
    if qkv.shape[0] and rows:
        kernel[(rows, v_heads, triton.cdiv(v_dim, bv))](
            qkv, a, b, A_log, dt_bias, ssm_state, out, meta.cu_seqlens, meta.cached,
            meta.state_slots, row0, row_range, qkv.stride(0), a.stride(0), k_heads, v_heads,
            k_dim**-0.5, DK=k_dim, DV=v_dim, BV=bv, num_warps=num_warps, **const,
        )  # fmt: skip
    return out
