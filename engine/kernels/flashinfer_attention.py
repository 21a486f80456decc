"""Paged attention on FlashInfer: one decode and one prefill wrapper, planned once per step
and run by every full-attention layer of that step.

The cache layout is the engine's own ([pages, page_size, kv_heads, head_dim] per layer, K and
V apart), FlashInfer's "NHD" layout. A decode step (one query a row) plans the decode wrapper;
any other step (prefill, mixed) plans the causal prefill wrapper over every row at once.
`plan` reads the page layout on the host (indptr, last-page lengths) and takes the flat page
list already on the device (the step's staged inputs), so it adds no H2D copy of its own but
the wrapper's small metadata.
"""

from __future__ import annotations

import torch

WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended split-k workspace per wrapper


class FlashInferAttention:
    def __init__(self, q_heads, kv_heads, head_dim, page_size, dtype, device):
        import flashinfer

        self.shape = (q_heads, kv_heads, head_dim, page_size)
        self.dtype = dtype
        self.device = device
        self._flashinfer = flashinfer
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD")
        prefill_workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(prefill_workspace, "NHD")
        self.graph_decode: dict[int, object] = {}  # bucket -> wrapper with fixed buffers
        self._active = None

    def add_graph_bucket(self, rows: int, max_pages_per_row: int) -> None:
        """A decode wrapper whose metadata lives in fixed device buffers, for a CUDA graph of
        `rows` rows (FlashInfer's `use_cuda_graph`). Buckets share the split-k workspace:
        their graphs never replay at once."""
        i32 = {"dtype": torch.int32, "device": self.device}
        self.graph_decode[rows] = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.zeros(rows + 1, **i32),
            paged_kv_indices_buffer=torch.zeros(rows * max_pages_per_row, **i32),
            paged_kv_last_page_len_buffer=torch.zeros(rows, **i32),
        )  # fmt: skip

    def plan(self, batch, bucket: int | None = None) -> None:
        host, types = batch.host, {"q_data_type": self.dtype, "kv_data_type": self.dtype}
        if batch.is_decode or bucket is not None:
            wrapper = self.decode if bucket is None else self.graph_decode[bucket]
            wrapper.plan(
                host.kv_indptr, batch.kv_indices, host.kv_last_page_len, *self.shape, **types
            )
            self._active = wrapper
        else:
            self.prefill.plan(
                host.qo_indptr, host.kv_indptr, batch.kv_indices, host.kv_last_page_len,
                *self.shape, causal=True, **types,
            )  # fmt: skip
            self._active = self.prefill

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """q [T, q_heads, head_dim] -> [T, q_heads, head_dim]; the step's K/V already stored."""
        return self._active.run(q, (k_cache, v_cache))
