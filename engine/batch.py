"""What one model step reads: the rows scheduled together, flattened.

Rows are requests. Each row contributes `num_new` tokens (a prompt chunk for a prefill row,
one token for a decode row); all rows' tokens are concatenated in row order. `ops` is the
backend the model's cached path calls (engine/kernels): the torch reference unless the engine
chose the CUDA kernels; the kernel fields are set by the engine's staged inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class HostLayout:
    """The step's paged-KV layout on the host, for backends that plan on the CPU (FlashInfer)."""

    kv_indptr: torch.Tensor  # [R + 1] int32, row r's pages are kv_indices[indptr[r]:indptr[r+1]]
    kv_last_page_len: torch.Tensor  # [R] int32, tokens in each row's last page
    qo_indptr: torch.Tensor  # [R + 1] int32, the same as cu_seqlens
    cu_seqlens: np.ndarray  # [R + 1] int64 numpy, for kernels that size their grid on the host
    # The longest row's new tokens, for FlashInfer's prefill plan, which otherwise finds it
    # with Python's max over a tensor (an element-wise loop of aten calls: ~0.3 ms of host
    # time at 64 rows on the H200). Its KV twin, `max_sequence_kv`, is not handed over:
    # FlashInfer 0.6.18's plan then skips building the host KV indptr it reads later
    # (UnboundLocalError `paged_kv_indptr_host` at every prefill step).
    max_q_len: int
    # Each row's KV length ([R] int32, pinned: a view of the staged buffer), FlashInfer's plan's
    # `seq_lens`: without it the plan derives them from the layout into a new pageable tensor
    # and copies that up "without blocking", which from pageable memory the driver may do only
    # after the work queued before it (INVARIANTS 46); None: the plan derives them.
    kv_lens: torch.Tensor | None = None


@dataclass
class GdnTables:
    """A step's Gated DeltaNet row and chunk tables, staged by the step inputs at fixed
    addresses (engine/kernels/gdn_tables.py builds them): what the fixed-grid kernels of a
    step padded to a token bucket read on the device instead of sizing their grids from it."""

    counts: torch.Tensor  # [4] int32: 0, the leading one-token rows, rows, chunks
    chunk_row: torch.Tensor  # [max chunks] int32, each chunk's row (the rest: 0)
    chunk_start: torch.Tensor  # [max chunks] int32, each chunk's first token
    first_chunk: torch.Tensor  # [max_rows + 1] int32, each chunked row's first chunk
    max_rows: int  # the step inputs' bound on a step's rows
    chunk: int  # tokens a chunk

    def row_bound(self, tokens: int) -> int:
        """The most rows a step of `tokens` tokens (a bucket) can have: a fixed grid's rows."""
        return min(self.max_rows, tokens)


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int, every row's new tokens, concatenated
    positions: torch.Tensor  # [T] int, absolute position of each token in its request
    cu_seqlens: torch.Tensor  # [R + 1] int, row r's tokens are [cu[r], cu[r+1])
    num_cached: list[int]  # per row, tokens already in the cache before this step
    num_new: list[int]  # per row, tokens in this step
    page_table: torch.Tensor  # [R, max_pages] int32, row r's pages; -1 pads
    slot_mapping: torch.Tensor  # [T] int, page * page_size + offset where each token's K/V go
    state_slots: torch.Tensor  # [R] int, each row's recurrent-state slot
    is_decode: bool  # every row has num_new == 1 and num_cached > 0
    ops: object  # the step's backend (engine/kernels: TORCH_OPS, or the CUDA ops)
    token_row: torch.Tensor | None = None  # [T] int32, the row of each token (kernels)
    cached: torch.Tensor | None = None  # [R] int32, num_cached on the device (kernels)
    kv_indices: torch.Tensor | None = None  # [pages] int32, every row's pages, concatenated
    # HostLayout's kv_indptr and kv_last_page_len on the device (the step inputs' views), for
    # kernels that read the page layout there (engine/kernels/triton_decode.py)
    kv_indptr: torch.Tensor | None = None  # [R + 1] int32
    kv_last_page_len: torch.Tensor | None = None  # [R] int32
    last_index: torch.Tensor | None = None  # [R] int32, staged last_token_index
    host: HostLayout | None = None
    feed_index: torch.Tensor | None = None  # [T] int32, -1 or an index into the fed tokens
    # Kept by the Gated DeltaNet kernels at the step's first layer (engine/kernels/triton_gdn.py,
    # triton_gdn_split.py):
    gdn_chunks: tuple | None = None  # ((chunk, row0), tables) of the split kernel
    gdn_one_token_rows: int | None = None  # how many leading rows have one new token
    gdn_scratch: tuple | None = None  # (shape, tensors): the split kernel's scratch, a step's
    gdn_tables: GdnTables | None = None  # staged for fixed grids (a step padded to a bucket)
    # the piecewise runner's token bucket (its token-wise ops replay graphs captured on another
    # step of that bucket), None for any other step
    token_bucket: int | None = None

    def gather_fed_tokens(self, fed: torch.Tensor | None) -> None:
        """Write into input_ids, in place and on the device, the tokens the host does not have
        yet: those of the step still in flight (`fed`), at the staged feed indices."""
        if self.feed_index is None or fed is None:
            return
        picked = fed[self.feed_index.clamp(min=0).long()].to(self.input_ids.dtype)
        self.input_ids.copy_(torch.where(self.feed_index >= 0, picked, self.input_ids))

    @property
    def num_rows(self) -> int:
        return len(self.num_new)

    @property
    def seq_lens(self) -> list[int]:
        return [c + n for c, n in zip(self.num_cached, self.num_new, strict=True)]

    @property
    def last_token_index(self) -> torch.Tensor:
        """[R] index into the flat token axis of each row's last token (where logits come from)."""
        if self.last_index is not None:
            return self.last_index
        return self.cu_seqlens[1:] - 1
