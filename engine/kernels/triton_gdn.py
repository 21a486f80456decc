"""Triton kernels of Gated DeltaNet that work on the state pool in place, through each row's
slot index: no gather of a batch's states, no scatter back. The CUDA ops call them here; a
prefill or mixed step's dispatch lives here, each kernel in a file of its own.

- `causal_conv` (triton_gdn_conv.py): the short depthwise conv + SiLU over every row's new
  tokens, the window before them read from the row's conv-state slot, the slot rewritten.
- `gated_delta_recurrent` (triton_gdn_recurrent.py): the gated delta rule token by token per
  (row, value head, value block). The decode step (one token a row) and exact fp32 prefill;
  launched as gdn_launch.py says (and, with `engine.gdn_decode: pipelined`, persistent).
- `gated_delta_chunked` (triton_gdn_chunked.py): the same rule a chunk of C tokens at a time,
  one launch per layer whatever the rows.
- `gated_delta_chunked_split` (triton_gdn_split.py; its kernels triton_gdn_split_kernels.py):
  the same in three launches (prepare, states, outputs), whose serial part is two tile
  products a chunk, launched as a `SplitConfig` says (engine/config/gdn_split.py).
- `gated_delta_prefill`: a prefill or mixed step's dispatch: the leading rows of one new token
  (a mixed step's decode rows) through the recurrence, the rest through a chunked kernel
  (`triton`, `triton_split`, or `auto`: the split one for rows of SPLIT_FROM_TOKENS or more).
- `gated_delta_fixed_grid`: the same dispatch (recurrence, then the split kernel) for a step
  padded to a token bucket, on grids set by the bucket, the step's counts and chunk tables
  read from the device where the step inputs staged them: what a CUDA graph can capture
  (engine.piecewise_gdn). The row and chunk kernels take those device bounds (`ROWS`,
  `ROW_RANGE`, `CHUNKS`; None: a grid sized on the host) and their programs past them exit,
  or (`PERSISTENT`) fewer programs stride over them (triton_gdn_rows.py: what every row
  program shares).

Layouts follow the torch reference (engine/layers/gated_delta.py): conv state
[slots, channels, kernel-1], recurrent state [slots, heads, k_dim, v_dim] (fp32, or bf16 with
engine.state_dtype: the kernels read it into fp32 and round it back on the store).
"""

from __future__ import annotations

import numpy as np
import torch

from engine.config.gdn_split import SPLIT_DEFAULT, SPLIT_FROM_TOKENS, SplitConfig
from engine.kernels.gdn_launch import (
    PIPELINED_LAUNCH,
    RECURRENT_LAUNCH,
    PipelinedLaunch,
    RecurrentLaunch,
)
from engine.kernels.gdn_tables import max_chunks, one_token_prefix
from engine.kernels.triton_gdn_chunked import gated_delta_chunked
from engine.kernels.triton_gdn_conv import causal_conv
from engine.kernels.triton_gdn_recurrent import gated_delta_recurrent, recurrent_fixed_grid
from engine.kernels.triton_gdn_split import gated_delta_chunked_split, split_launches

__all__ = [
    "PREFILL_KINDS",
    "causal_conv",
    "gated_delta_chunked",
    "gated_delta_chunked_split",
    "gated_delta_fixed_grid",
    "gated_delta_prefill",
    "gated_delta_recurrent",
]


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
    pipelined: bool = False, launch: RecurrentLaunch = RECURRENT_LAUNCH,
    pipelined_launch: PipelinedLaunch = PIPELINED_LAUNCH,
) -> torch.Tensor:  # fmt: skip
    """`gated_delta_recurrent`'s contract for a prefill or mixed step: the leading rows of one
    new token (a mixed step's decode rows) through the recurrence (`pipelined`: its
    persistent, pipelined form), which costs them a token's work instead of a whole chunk's
    program, and the rest through the chunked kernel `kind` (PREFILL_KINDS; `auto`: the split
    one when the longest row is `split_from` tokens or more; the split one launched as `split`
    says), both writing into one output. Rows of one token later in the batch stay chunked.
    `launch`, `pipelined_launch`: the recurrence's (gdn_launch.py)."""
    if kind not in PREFILL_KINDS:
        raise ValueError(f"kind must be one of {', '.join(PREFILL_KINDS)}, got {kind!r}")
    args = (qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim)
    single = _one_token_rows(meta)
    out = gated_delta_recurrent(
        *args, rows=single, pipelined=pipelined, launch=launch, pipelined_launch=pipelined_launch
    )
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
    split: SplitConfig = SPLIT_DEFAULT, launch: RecurrentLaunch = RECURRENT_LAUNCH,
) -> torch.Tensor:  # fmt: skip
    """`gated_delta_prefill`'s result for a step padded to a token bucket whose tables the step
    inputs staged (`meta.gdn_tables`), on grids set by the token count alone: the leading
    one-token rows through the recurrence, the rest through the split kernel (launched as
    `split` says; its chunk must be the tables'), every count and table read from the device
    at the staged (fixed) addresses. A launch's grid and its other arguments are the same for
    every step of the bucket, so one CUDA graph serves them all. Padding tokens' outputs are 0.
    `launch`: the recurrence's (gdn_launch.py)."""
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
    recurrent_fixed_grid(
        qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim,
        rows if cap is None else min(rows, cap), counts, out, cap is not None, launch,
    )  # fmt: skip
    chunks = (max_chunks(tokens, rows, staged.chunk), staged.chunk_row, staged.chunk_start,
              staged.first_chunk, counts[3:])  # fmt: skip
    split_launches(qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim, split,
                   chunks, (rows, 0, counts[1:]), out)  # fmt: skip
    return out
