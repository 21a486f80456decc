"""The split Gated DeltaNet kernel's launches (`gated_delta_chunked_split`; `split_launches`,
which the fixed grids of triton_gdn.py share): the chunk tables and fp32 scratch built once a
step and kept on its batch, and the three kernels of triton_gdn_split_kernels.py launched as a
`SplitConfig` says (engine/config/gdn_split.py: chunk, value blocks, warps, stages, the fixed
grids' program counts, the scores option)."""

from __future__ import annotations

import numpy as np
import torch
import triton

from engine.config.gdn_split import SPLIT_DEFAULT, SplitConfig
from engine.kernels.gdn_tables import chunk_tables
from engine.kernels.triton_gdn_chunked import doublings
from engine.kernels.triton_gdn_rows import output_for
from engine.kernels.triton_gdn_split_kernels import (
    _gdn_outputs_kernel,
    _gdn_prepare_kernel,
    _gdn_states_kernel,
)
from engine.layers.sampler import rows_to


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
    out = output_for(qkv, a.shape[1], v_dim, out)
    if not qkv.shape[0] or row0 == meta.num_rows:
        return out
    count, *tables = _chunk_tables(meta, split.chunk, row0)
    rows = (meta.num_rows - row0, row0, None)
    split_launches(qkv, a, b, A_log, dt_bias, ssm_state, meta, k_heads, k_dim, v_dim, split,
                    (count, *tables, None), rows, out)  # fmt: skip
    return out


def split_launches(
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
        LEVELS=doublings(chunk), PERSISTENT=chunk_cap is not None, **common,
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
