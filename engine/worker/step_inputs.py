"""A step's inputs, built on the host with numpy and sent to the device in one copy.

Every integer input of a step (token ids, positions, KV slots, page tables, state slots, row
offsets) is packed into one reused int32 host buffer, pinned on CUDA, and reaches the device
in a single non-blocking H2D copy; the batch's tensors are views of the device twin. The
host buffer is rewritten by the next step's staging, so on CUDA the next `stage` must not
start before this step's copy has read it: the strict loop guarantees that by waiting for
the step; the overlapped loop will double-buffer exactly this buffer (next issue).
"""

from __future__ import annotations

from itertools import chain

import numpy as np
import torch

from engine.batch import ForwardBatch, HostLayout
from engine.worker.scheduler import ScheduledRow


class StepInputs:
    def __init__(self, max_tokens: int, max_rows: int, max_pages: int, device: torch.device):
        self.device = device
        self.on_cuda = device.type == "cuda"
        # tokens: ids, positions, kv slots, rows; rows: cu, last, cached, slots, indptr,
        # last page len; pages: the flat page list and the padded [R, W] table.
        capacity = 4 * max_tokens + 6 * (max_rows + 1) + 2 * max_rows * max_pages
        self.host = torch.empty(capacity, dtype=torch.int32, pin_memory=self.on_cuda)
        self._host_np = self.host.numpy()
        self.device_buffer = (
            torch.empty(capacity, dtype=torch.int32, device=device) if self.on_cuda else self.host
        )

    def stage(self, rows: list[ScheduledRow], page_size: int, ops) -> ForwardBatch:
        num_new = np.fromiter((r.num_new for r in rows), dtype=np.int64, count=len(rows))
        cached = np.fromiter((r.request.num_cached for r in rows), dtype=np.int64, count=len(rows))
        cu = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(num_new, out=cu[1:])
        token_row = np.repeat(np.arange(len(rows)), num_new)
        positions = np.arange(cu[-1]) - cu[token_row] + cached[token_row]
        seq_lens = cached + num_new
        row_pages = -(-seq_lens // page_size)
        kv_indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(row_pages, out=kv_indptr[1:])
        pages_used = zip(rows, row_pages.tolist(), strict=True)
        kv_indices = np.fromiter(
            chain.from_iterable(r.request.pages[:n] for r, n in pages_used),
            dtype=np.int64,
            count=int(kv_indptr[-1]),
        )
        slots = kv_indices[kv_indptr[token_row] + positions // page_size] * page_size
        width = int(row_pages.max())
        table = np.full((len(rows), width), -1, dtype=np.int64)
        table[np.arange(width)[None, :] < row_pages[:, None]] = kv_indices
        spans = zip(rows, cached.tolist(), num_new.tolist(), strict=True)
        ids = np.fromiter(
            chain.from_iterable(r.request.tokens[c : c + n] for r, c, n in spans),
            dtype=np.int64,
            count=int(cu[-1]),
        )
        parts = {
            "input_ids": ids,
            "positions": positions,
            "slot_mapping": slots + positions % page_size,
            "token_row": token_row,
            "cu_seqlens": cu,
            "last_index": cu[1:] - 1,
            "cached": cached,
            "state_slots": np.fromiter((r.request.slot for r in rows), np.int64, len(rows)),
            "kv_indptr": kv_indptr,
            "kv_last_page_len": seq_lens - (row_pages - 1) * page_size,
            "kv_indices": kv_indices,
            "page_table": table,
        }
        host, dev = self._send(parts)
        return ForwardBatch(
            input_ids=dev["input_ids"],
            positions=dev["positions"],
            cu_seqlens=dev["cu_seqlens"],
            num_cached=cached.tolist(),
            num_new=num_new.tolist(),
            page_table=dev["page_table"],
            slot_mapping=dev["slot_mapping"],
            state_slots=dev["state_slots"],
            is_decode=all(r.walk == "decode" for r in rows),
            ops=ops,
            token_row=dev["token_row"],
            cached=dev["cached"],
            kv_indices=dev["kv_indices"],
            last_index=dev["last_index"],
            host=HostLayout(host["kv_indptr"], host["kv_last_page_len"], host["cu_seqlens"], cu),
        )

    def _send(self, parts: dict[str, np.ndarray]):
        """Pack into the host buffer, one H2D copy, and views of both sides by name."""
        offset, spans = 0, {}
        for name, array in parts.items():
            end = offset + array.size
            self._host_np[offset:end] = array.reshape(-1)
            spans[name] = (offset, end, array.shape)
            offset = end
        if self.on_cuda:
            self.device_buffer[:offset].copy_(self.host[:offset], non_blocking=True)

        def views(buffer: torch.Tensor) -> dict[str, torch.Tensor]:
            return {name: buffer[a:b].view(shape) for name, (a, b, shape) in spans.items()}

        return views(self.host), views(self.device_buffer)
