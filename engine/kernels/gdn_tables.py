"""Gated DeltaNet's per-step row and chunk tables, built on the host with numpy from the rows'
lengths, for the step inputs to stage at fixed addresses (engine/worker/step_inputs.py).

A prefill or mixed step's Gated DeltaNet runs its leading rows of one new token (a mixed
step's decode rows) through the recurrence and the rest a chunk of CHUNK tokens at a time
(engine/kernels/triton_gdn.py). The kernels that a CUDA graph can capture read what depends
on the rows from the device: the counts, and the split kernel's chunk tables over the
chunked rows (each chunk's row and first token, each row's first chunk). numpy only: the
step inputs stage these without importing triton.
"""

from __future__ import annotations

import numpy as np

from engine.config.gdn_split import CHUNK


def max_chunks(max_tokens: int, max_rows: int, chunk: int = CHUNK) -> int:
    """The most chunks a step of `max_tokens` tokens in `max_rows` rows can have: every row's
    last chunk may be partial, so sum(ceil(n / chunk)) < tokens / chunk + rows; and a chunk
    holds a token at least."""
    return min(max_tokens, max_tokens // chunk + max_rows)


def one_token_prefix(num_new: np.ndarray) -> int:
    """How many of the step's leading rows have one new token (the scheduler puts decode rows
    first): the rows the recurrence takes."""
    longer = np.flatnonzero(num_new != 1)
    return int(longer[0]) if longer.size else len(num_new)


def chunk_tables(
    num_new: np.ndarray, row0: int, chunk: int = CHUNK
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chunks of `chunk` tokens of the rows from `row0` on: each chunk's row and first
    token, and each row's first chunk (rows before `row0` have none: their entry is 0)."""
    per_row = -(-num_new // chunk)
    per_row[:row0] = 0
    first = np.cumsum(per_row) - per_row
    chunk_row = np.repeat(np.arange(len(num_new)), per_row)
    row_start = np.cumsum(num_new) - num_new
    within = np.arange(len(chunk_row)) - first[chunk_row]
    return chunk_row, row_start[chunk_row] + within * chunk, first
