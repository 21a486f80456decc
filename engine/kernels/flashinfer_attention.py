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

        def workspace() -> torch.Tensor:
            return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)

        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD")
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")
        self._active = None

    def plan(self, batch) -> None:
        host, types = batch.host, {"q_data_type": self.dtype, "kv_data_type": self.dtype}
        if batch.is_decode:
            self.decode.plan(
                host.kv_indptr, batch.kv_indices, host.kv_last_page_len, *self.shape, **types
            )
            self._active = self.decode
        else:
            self.prefill.plan(
                host.qo_indptr, host.kv_indptr, batch.kv_indices, host.kv_last_page_len,
                *self.shape, causal=True, **types,
            )  # fmt: skip
            self._active = self.prefill

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """q [T, q_heads, head_dim] -> [T, q_heads, head_dim]; the step's K/V already stored."""
        return self._active.run(q, (k_cache, v_cache))
