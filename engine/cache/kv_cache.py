"""The paged KV pool and the recurrent-state slots, with their allocators.

Full-attention layers keep K and V in pages of `page_size` tokens; a request owns a page
table. Linear-attention (Gated DeltaNet) layers keep a fixed state per request: the causal
conv window and the recurrent matrix, in one slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.cache.free_list import FreeList


@dataclass(frozen=True)
class CacheShapes:
    num_full_layers: int
    num_linear_layers: int
    kv_heads: int
    head_dim: int
    conv_dim: int  # channels of the causal conv (q, k and v of a linear layer)
    conv_kernel: int
    state_heads: int  # value heads of a linear layer
    state_k: int  # key head dim
    state_v: int  # value head dim


class KVCache:
    """Device tensors of the cache plus allocators for pages and state slots."""

    def __init__(
        self,
        shapes: CacheShapes,
        num_pages: int,
        page_size: int,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device | str,
        state_dtype: torch.dtype = torch.float32,
    ):
        """`dtype`: the K/V pages and conv states; `state_dtype`: the recurrent states."""
        self.shapes = shapes
        self.page_size = page_size
        self.pages = FreeList(num_pages)
        self.slots = FreeList(num_slots)
        # One page and one state slot past the allocators' ids: the padding rows of a graph
        # bucket read and write these, never a request's.
        self.sink_page, self.sink_slot = num_pages, num_slots
        num_pages, num_slots = num_pages + 1, num_slots + 1
        kv = (num_pages, page_size, shapes.kv_heads, shapes.head_dim)
        self.k = [
            torch.zeros(kv, dtype=dtype, device=device) for _ in range(shapes.num_full_layers)
        ]
        self.v = [
            torch.zeros(kv, dtype=dtype, device=device) for _ in range(shapes.num_full_layers)
        ]
        conv = (num_slots, shapes.conv_dim, shapes.conv_kernel - 1)
        rec = (num_slots, shapes.state_heads, shapes.state_k, shapes.state_v)
        self.conv_state = [
            torch.zeros(conv, dtype=dtype, device=device) for _ in range(shapes.num_linear_layers)
        ]
        # The recurrent state accumulates over thousands of steps: fp32 unless told otherwise
        # (engine.state_dtype); the math on it is fp32 either way, only its storage rounds.
        self.ssm_state = [
            torch.zeros(rec, dtype=state_dtype, device=device)
            for _ in range(shapes.num_linear_layers)
        ]

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)
