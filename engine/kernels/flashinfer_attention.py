"""Paged attention on FlashInfer: decode and prefill wrappers, planned once per step and run
by every full-attention layer of that step.

The cache layout is the engine's own ([pages, page_size, kv_heads, head_dim] per layer, K and
V apart), FlashInfer's "NHD" layout. A decode step (one query a row) plans a decode wrapper;
any other step (prefill, mixed) plans the causal prefill wrapper over every row at once.
`plan` reads the page layout on the host (indptr, last-page lengths) and takes the flat page
list already on the device (the step's staged inputs).

Double buffering: a wrapper's `plan` writes its metadata into a pinned host buffer of its own
and copies it to the device without blocking, so a host that plans step N+1 while step N's
copy is still queued would overwrite N's metadata. The class declares `force_double_buffer`
and keeps one set of wrappers per slot, used in turn (`slots`, 2 unless turned off).
"""

from __future__ import annotations

import torch

WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended split-k workspace


class FlashInferAttention:
    force_double_buffer = True

    def __init__(
        self, q_heads, kv_heads, head_dim, page_size, dtype, device, slots: int = 2,
        tensor_cores: bool = False,
    ):  # fmt: skip
        """`tensor_cores`: decode steps run FlashInfer's tensor-core kernel (its prefill
        kernel with one query a row) instead of its CUDA-core decode kernel."""
        import flashinfer

        self.tensor_cores = tensor_cores
        self.shape = (q_heads, kv_heads, head_dim, page_size)
        self.dtype = dtype
        self.device = device
        self.slots = slots
        self._flashinfer = flashinfer
        # Steps run one after another on one stream, so every wrapper shares one workspace.
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.decode = [self._decode_wrapper() for _ in range(slots)]
        self.prefill = [
            flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
            for _ in range(slots)
        ]
        self.graph_decode: dict[tuple[int, int], object] = {}  # (bucket, slot) -> wrapper
        self.next_slot = 0
        self._active = None

    def _decode_wrapper(self, rows: int | None = None, max_pages_per_row: int = 0):
        tensor_cores = {"use_tensor_cores": self.tensor_cores}
        if rows is None:
            return self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", **tensor_cores
            )
        i32 = {"dtype": torch.int32, "device": self.device}
        return self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_cuda_graph=True, **tensor_cores,
            paged_kv_indptr_buffer=torch.zeros(rows + 1, **i32),
            paged_kv_indices_buffer=torch.zeros(rows * max_pages_per_row, **i32),
            paged_kv_last_page_len_buffer=torch.zeros(rows, **i32),
        )  # fmt: skip

    def add_graph_bucket(self, rows: int, max_pages_per_row: int) -> None:
        """Decode wrappers whose metadata lives in fixed device buffers (FlashInfer's
        `use_cuda_graph`), one per slot, for the CUDA graphs of `rows` rows."""
        for slot in range(self.slots):
            self.graph_decode[rows, slot] = self._decode_wrapper(rows, max_pages_per_row)

    def plan(self, batch, bucket: int | None = None) -> int:
        """Plan the step on the next slot's wrapper; returns that slot."""
        slot, self.next_slot = self.next_slot, (self.next_slot + 1) % self.slots
        host, types = batch.host, {"q_data_type": self.dtype, "kv_data_type": self.dtype}
        if batch.is_decode or bucket is not None:
            wrapper = self.decode[slot] if bucket is None else self.graph_decode[bucket, slot]
            wrapper.plan(
                host.kv_indptr, batch.kv_indices, host.kv_last_page_len, *self.shape, **types
            )
        else:
            wrapper = self.prefill[slot]
            wrapper.plan(
                host.qo_indptr, host.kv_indptr, batch.kv_indices, host.kv_last_page_len,
                *self.shape, causal=True, **types,
                max_token_per_sequence=host.max_q_len,
            )  # fmt: skip
        self._active = wrapper
        return slot

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """q [T, q_heads, head_dim] -> [T, q_heads, head_dim]; the step's K/V already stored."""
        return self._active.run(q, (k_cache, v_cache))
