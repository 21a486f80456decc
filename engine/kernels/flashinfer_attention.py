"""Paged attention on FlashInfer: decode and prefill wrappers, planned once per step and run
by every full-attention layer of that step; decode steps on our Triton kernel instead when
asked (`decode_kernel="triton"`, engine.decode_attention).

The cache layout is the engine's own ([pages, page_size, kv_heads, head_dim] per layer, K and
V apart), FlashInfer's "NHD" layout. A decode step (one query a row) plans a decode wrapper;
any other step (prefill, mixed) plans the causal prefill wrapper over every row at once.
`plan` reads the page layout on the host (indptr, last-page lengths) and takes the flat page
list already on the device (the step's staged inputs). On the Triton path a decode step plans
nothing on the host: it keeps the step's device views of the page layout and the split count
of its rows (`TritonDecode`), and each layer's `run` launches triton_decode.paged_decode on
them; a graph bucket's rows fix the split count, so its graph replays one grid.

Double buffering: a wrapper's `plan` writes its metadata into a pinned host buffer of its own
and copies it to the device without blocking, so a host that plans step N+1 while step N's
copy is still queued would overwrite N's metadata. The class declares `force_double_buffer`
and keeps one set of wrappers per slot, used in turn (`slots`, 2 unless turned off); the
Triton path's steps take their slot in the same turn (their views are the step inputs', which
double-buffer themselves), so a graph is still keyed by (bucket, slot). Each slot's plan
records a fence (engine/staging.py): a loop that plans twice a step (`engine.split_mixed`)
waits there for the slot's last plan's copy.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.kernels import SMS, flashinfer_import, triton_decode
from engine.kernels.decode_config import decode_splits
from engine.staging import CopyFences, pack_into

WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended split-k workspace


class TritonDecode(NamedTuple):
    """A decode step planned for our Triton kernel: the step's page layout on the device (the
    step inputs' views: fixed addresses) and the split count of its rows."""

    kv_indices: torch.Tensor
    kv_indptr: torch.Tensor
    kv_last_page_len: torch.Tensor
    splits: int

    @classmethod
    def of(cls, batch, kv_heads: int, sms: int = SMS) -> TritonDecode:
        """A decode step's plan: its device page layout, the split count of its rows alone."""
        layout = (batch.kv_indices, batch.kv_indptr, batch.kv_last_page_len)
        return cls(*layout, decode_splits(batch.num_rows, kv_heads, sms))

    def run(self, q, k_cache, v_cache, scale: float) -> torch.Tensor:
        layout = (self.kv_indices, self.kv_indptr, self.kv_last_page_len)
        return triton_decode.paged_decode(q, k_cache, v_cache, *layout, scale, self.splits)


class FlashInferAttention:
    force_double_buffer = True

    def __init__(
        self, q_heads, kv_heads, head_dim, page_size, dtype, device, slots: int = 2,
        tensor_cores: bool = False, decode_kernel: str = "flashinfer",
    ):  # fmt: skip
        """`tensor_cores`: decode steps run FlashInfer's tensor-core kernel (its prefill
        kernel with one query a row) instead of its CUDA-core decode kernel. `decode_kernel`:
        "flashinfer" (its decode wrappers) or "triton" (ours; no decode wrapper is built)."""
        flashinfer = flashinfer_import.flashinfer()
        self.tensor_cores = tensor_cores
        self.decode_kernel = decode_kernel
        self.shape = (q_heads, kv_heads, head_dim, page_size)
        self.dtype = dtype
        self.device = torch.device(device)
        self.slots = slots
        self.sms = SMS  # the Triton path's split count aims at a few programs an SM
        if self.device.type == "cuda":
            self.sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self._flashinfer = flashinfer
        # Steps run one after another on one stream, so every wrapper shares one workspace.
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        flashinfer_decode = decode_kernel == "flashinfer"
        self.decode = [self._decode_wrapper() for _ in range(slots)] if flashinfer_decode else []
        self.prefill = [
            flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
            for _ in range(slots)
        ]
        self.graph_decode: dict[tuple[int, int], object] = {}  # (bucket, slot) -> wrapper
        self.next_slot = 0
        self.fences = CopyFences(slots, self.device.type == "cuda")  # each slot's last plan
        self._own: dict[int, torch.Tensor] = {}  # slot -> pinned layout (`_layout`)
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
        `use_cuda_graph`), one per slot, for the CUDA graphs of `rows` rows; none on the Triton
        path (its kernel reads the step inputs' fixed views)."""
        if self.decode_kernel == "triton":
            return
        for slot in range(self.slots):
            self.graph_decode[rows, slot] = self._decode_wrapper(rows, max_pages_per_row)

    def plan(self, batch, bucket: int | None = None) -> int:
        """Plan the step on the next slot's wrapper (a decode step on the Triton path: keep
        its device layout and split count); returns that slot."""
        slot, self.next_slot = self.next_slot, (self.next_slot + 1) % self.slots
        host, types = batch.host, {"q_data_type": self.dtype, "kv_data_type": self.dtype}
        decode = batch.is_decode or bucket is not None
        if decode and self.decode_kernel == "triton":
            self._active = TritonDecode.of(batch, self.shape[1], self.sms)
        elif decode:
            wrapper = self.decode[slot] if bucket is None else self.graph_decode[bucket, slot]
            self.fences.before_write(slot)
            indptr, last = self._layout(slot, host.kv_indptr, host.kv_last_page_len)
            wrapper.plan(indptr, batch.kv_indices, last, *self.shape, **types)
            self.fences.copied(slot)
            self._active = wrapper
        else:
            wrapper = self.prefill[slot]
            self.fences.before_write(slot)
            qo, indptr, last, lens = self._layout(
                slot, host.qo_indptr, host.kv_indptr, host.kv_last_page_len, host.kv_lens
            )
            wrapper.plan(
                qo, indptr, batch.kv_indices, last, *self.shape, causal=True, **types,
                max_token_per_sequence=host.max_q_len, seq_lens=lens,
            )  # fmt: skip
            self.fences.copied(slot)
            self._active = wrapper
        return slot

    def _layout(self, slot: int, *arrays: torch.Tensor | None) -> list[torch.Tensor | None]:
        """The host layout a plan reads (and copies up without blocking). As the step inputs
        staged it, except where a slot's fence waits (`fences.wait`: a loop that plans twice
        a step): then a copy in this slot's own pinned buffer, written after the fence, so
        the plan's copies are this slot's and no later staging of the step inputs (whose
        fences precede these copies) can rewrite what they have not read yet."""
        if not self.fences.wait or not self.fences.on_cuda:
            return list(arrays)
        size = sum(len(a) for a in arrays if a is not None)
        own = self._own.get(slot)
        if own is None or len(own) < size:
            own = self._own[slot] = torch.empty(2 * size, dtype=torch.int32, pin_memory=True)
        return pack_into(own, arrays)

    def run(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """q [T, q_heads, head_dim] -> [T, q_heads, head_dim]; the step's K/V already stored.
        `scale` is the softmax scale of our Triton kernel; FlashInfer's plans keep their
        default, 1 / sqrt(head_dim), which is every model's."""
        if isinstance(self._active, TritonDecode):
            return self._active.run(q, k_cache, v_cache, scale)
        return self._active.run(q, (k_cache, v_cache))
