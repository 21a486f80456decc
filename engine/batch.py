"""What one model step reads: the rows scheduled together, flattened.

Rows are requests. Each row contributes `num_new` tokens (a prompt chunk for a prefill row,
one token for a decode row); all rows' tokens are concatenated in row order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64, every row's new tokens, concatenated
    positions: torch.Tensor  # [T] int64, absolute position of each token in its request
    cu_seqlens: torch.Tensor  # [R + 1] int64, row r's tokens are [cu[r], cu[r+1])
    num_cached: list[int]  # per row, tokens already in the cache before this step
    num_new: list[int]  # per row, tokens in this step
    page_table: torch.Tensor  # [R, max_pages] int32, row r's pages; -1 pads
    slot_mapping: torch.Tensor  # [T] int64, page * page_size + offset where each token's K/V go
    state_slots: torch.Tensor  # [R] int64, each row's recurrent-state slot
    is_decode: bool  # every row has num_new == 1 and num_cached > 0

    @property
    def num_rows(self) -> int:
        return len(self.num_new)

    @property
    def seq_lens(self) -> list[int]:
        return [c + n for c, n in zip(self.num_cached, self.num_new, strict=True)]

    @property
    def last_token_index(self) -> torch.Tensor:
        """[R] index into the flat token axis of each row's last token (where logits come from)."""
        return self.cu_seqlens[1:] - 1
