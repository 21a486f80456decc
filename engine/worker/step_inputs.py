"""A step's inputs, built on the host with numpy and sent to the device in one copy.

Every integer input of a step (token ids, positions, KV slots, page lists, state slots, row
offsets) is written into one reused int32 host buffer, pinned on CUDA, and reaches the device
in a single non-blocking H2D copy; the batch's tensors are views of the device twin. Each
field has a fixed offset, sized for the largest step, so a field of a given length is always
the same device address: a captured CUDA graph reads next step's inputs where it read this
step's. A decode step can be padded to a graph bucket: padding rows write no K/V (slot -1),
attend over the cache's sink page and run their state in the sink slot.

The H2D copy is non-blocking: it reads the pinned host buffer when the GPU reaches it, which
may be after the host has staged the next step. With one host buffer, a host that runs ahead
(the overlapped loop) would overwrite step N's inputs before N's copy read them; so the class
declares `force_double_buffer` and keeps `slots` host buffers (2 by default), used in turn:
staging N+2 reuses N's buffer, and the worker never stages N+2 before N (in stream order,
before N+1) completed; a loop that stages twice a step (`engine.split_mixed`) waits for a
buffer's last copy instead (engine/staging.py). The device buffer stays one: copies and
steps are ordered on one stream.
"""

from __future__ import annotations

from itertools import chain

import numpy as np
import torch

from engine.batch import ForwardBatch, GdnTables, HostLayout
from engine.cache import KVCache
from engine.kernels.gdn_tables import CHUNK, chunk_tables, max_chunks, one_token_prefix
from engine.staging import CopyFences
from engine.worker.scheduler import ScheduledRow

TOKEN_FIELDS = ("input_ids", "positions", "slot_mapping", "token_row", "feed_index")
ROW_FIELDS = (
    "cu_seqlens", "last_index", "cached", "state_slots", "kv_indptr", "kv_last_page_len",
    "kv_lens",
)  # fmt: skip


class StepInputs:
    force_double_buffer = True  # a pinned host buffer behind a non-blocking H2D copy

    def __init__(
        self, max_tokens: int, max_rows: int, max_pages: int, device: torch.device,
        slots: int = 2, gdn_chunk: int = CHUNK,
    ):  # fmt: skip
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.on_cuda = device.type == "cuda"
        sizes = {name: max_tokens for name in TOKEN_FIELDS}
        sizes |= {name: max_rows + 1 for name in ROW_FIELDS}
        # Gated DeltaNet's tables for fixed grids, before the page lists: the copy ends at the
        # last field written, so every step copies their span (4 KiB at max_rows 256, 2048
        # tokens), where after the page table (only the reference's) a step staging them
        # would copy that whole table
        self.max_rows, self.gdn_chunk = max_rows, gdn_chunk  # tokens a chunk of the tables
        self.max_chunks = max_chunks(max_tokens, max_rows, gdn_chunk)
        sizes |= {"gdn_counts": 4, "gdn_first_chunk": max_rows + 1}
        sizes |= {"gdn_chunk_row": self.max_chunks, "gdn_chunk_start": self.max_chunks}
        sizes |= {"kv_indices": max_rows * max_pages, "page_table": max_rows * max_pages}
        self.offsets, offset = {}, 0
        for name, size in sizes.items():  # the page table last: only the reference reads it
            self.offsets[name] = offset
            offset += size
        self.hosts = [
            torch.empty(offset, dtype=torch.int32, pin_memory=self.on_cuda) for _ in range(slots)
        ]
        self.slots = slots
        self.slot = 0  # the host buffer the next stage writes
        # Per host buffer, an event after the last copy that read it; staging into a buffer
        # whose copy has not run yet is the hazard itself (that step would read the new
        # inputs): counted, so a run with one buffer shows how often it happened, or waited
        # for where a loop stages twice a step (`fences.wait`, engine.split_mixed)
        self.fences = CopyFences(slots, self.on_cuda)
        self.device_buffer = (
            torch.empty(offset, dtype=torch.int32, device=device) if self.on_cuda else None
        )

    def stage(
        self,
        rows: list[ScheduledRow],
        cache: KVCache,
        ops,
        pad_to: int | None = None,
        feed_index: dict[int, int] | None = None,
        pad_tokens_to: int | None = None,
        gdn_tables: bool = False,
    ) -> ForwardBatch:
        """The step's ForwardBatch; with `pad_to`, a decode step padded to that many rows;
        with `pad_tokens_to`, the token fields padded to that many tokens (the piecewise
        runner's token bucket: padding tokens have id 0, position 0 and store no K/V, and
        belong to no row). `feed_index` maps the rid of a row whose input token the host
        does not have yet to that token's index in the in-flight step's output (see
        ForwardBatch.gather_fed_tokens). `gdn_tables`: stage Gated DeltaNet's row and chunk
        tables too, for its kernels on grids fixed per token bucket (ForwardBatch.gdn_tables)."""
        page_size = cache.page_size
        real = len(rows)
        pad = (pad_to or real) - real
        num_new = np.ones(real + pad, dtype=np.int64)
        num_new[:real] = [r.num_new for r in rows]
        cached = np.ones(real + pad, dtype=np.int64)
        cached[:real] = [r.request.num_cached for r in rows]
        cu = np.zeros(real + pad + 1, dtype=np.int64)
        np.cumsum(num_new, out=cu[1:])
        token_row = np.repeat(np.arange(real + pad), num_new)
        positions = np.arange(cu[-1]) - cu[token_row] + cached[token_row]
        positions[cu[real] :] = 0
        seq_lens = cached + num_new
        row_pages = -(-seq_lens // page_size)
        row_pages[real:] = 1
        kv_indptr = np.zeros(real + pad + 1, dtype=np.int64)
        np.cumsum(row_pages, out=kv_indptr[1:])
        kv_indices = np.full(int(kv_indptr[-1]), cache.sink_page, dtype=np.int64)
        kv_indices[: kv_indptr[real]] = np.fromiter(
            chain.from_iterable(
                r.request.pages[:n] for r, n in zip(rows, row_pages.tolist(), strict=False)
            ),
            dtype=np.int64,
            count=int(kv_indptr[real]),
        )
        slots = kv_indices[kv_indptr[token_row] + positions // page_size] * page_size
        slots += positions % page_size
        slots[cu[real] :] = -1  # padding tokens store no K/V
        last_page_len = seq_lens - (row_pages - 1) * page_size
        last_page_len[real:] = 1
        ids, feed = _token_ids(rows, cached, num_new, cu, feed_index)
        state_slots = np.full(real + pad, cache.sink_slot, dtype=np.int64)
        state_slots[:real] = [r.request.slot for r in rows]
        if pad_tokens_to is not None:
            extra = pad_tokens_to - len(ids)
            if extra < 0:
                raise ValueError(f"{len(ids)} tokens do not fit a bucket of {pad_tokens_to}")
            ids, positions, token_row = (np.pad(a, (0, extra)) for a in (ids, positions, token_row))
            # no K/V stored; the host has every padding token (nothing fed from the device)
            slots, feed = (np.pad(a, (0, extra), constant_values=-1) for a in (slots, feed))
        parts = {
            "input_ids": ids,
            "positions": positions,
            "slot_mapping": slots,
            "token_row": token_row,
            "feed_index": feed,
            "cu_seqlens": cu,
            "last_index": cu[1:] - 1,
            "cached": cached,
            "state_slots": state_slots,
            "kv_indptr": kv_indptr,
            "kv_last_page_len": last_page_len,
            # each row's KV length as FlashInfer derives it from the layout (a padding row: 1)
            "kv_lens": (row_pages - 1) * page_size + last_page_len,
            "kv_indices": kv_indices,
        }
        if gdn_tables:
            parts |= self._gdn_parts(num_new)
        if getattr(ops, "reads_page_table", True):
            width = int(row_pages.max())
            table = np.full((real + pad, width), -1, dtype=np.int64)
            table[np.arange(width)[None, :] < row_pages[:, None]] = kv_indices
            parts["page_table"] = table
        host, dev = self._send(parts)
        return ForwardBatch(
            input_ids=dev["input_ids"],
            positions=dev["positions"],
            cu_seqlens=dev["cu_seqlens"],
            num_cached=cached.tolist(),
            num_new=num_new.tolist(),
            page_table=dev.get("page_table"),
            slot_mapping=dev["slot_mapping"],
            state_slots=dev["state_slots"],
            is_decode=all(r.walk == "decode" for r in rows),
            ops=ops,
            feed_index=dev["feed_index"] if feed_index else None,
            token_row=dev["token_row"],
            cached=dev["cached"],
            kv_indices=dev["kv_indices"],
            kv_indptr=dev["kv_indptr"],
            kv_last_page_len=dev["kv_last_page_len"],
            last_index=dev["last_index"],
            host=HostLayout(
                host["kv_indptr"],
                host["kv_last_page_len"],
                host["cu_seqlens"],
                cu,
                int(num_new.max()),
                host["kv_lens"],
            ),
            gdn_tables=self._gdn_tables(dev) if gdn_tables else None,
            token_bucket=pad_tokens_to,
        )

    def _gdn_tables(self, dev: dict[str, torch.Tensor]) -> GdnTables:
        fields = ("gdn_counts", "gdn_chunk_row", "gdn_chunk_start", "gdn_first_chunk")
        return GdnTables(*(dev[name] for name in fields), self.max_rows, self.gdn_chunk)

    def _gdn_parts(self, num_new: np.ndarray) -> dict[str, np.ndarray]:
        """The Gated DeltaNet tables of rows of `num_new` tokens, each field at its full size
        (the same views every step): the counts [0, the leading one-token rows, rows, chunks],
        and the chunks of the rows after those."""
        single = one_token_prefix(num_new)
        chunk_row, chunk_start, first = chunk_tables(num_new, single, self.gdn_chunk)
        chunks = len(chunk_row)

        def full(array: np.ndarray, size: int) -> np.ndarray:
            return np.pad(array, (0, size - len(array)))

        return {
            "gdn_counts": np.array([0, single, len(num_new), chunks]),
            "gdn_first_chunk": full(first, self.max_rows + 1),
            "gdn_chunk_row": full(chunk_row, self.max_chunks),
            "gdn_chunk_start": full(chunk_start, self.max_chunks),
        }

    def _send(self, parts: dict[str, np.ndarray]):
        """Write each field at its offset, copy the used prefix in one H2D copy, and return
        views of both sides by name."""
        slot, host = self.slot, self.hosts[self.slot]
        self.slot = (self.slot + 1) % len(self.hosts)
        self.fences.before_write(slot)
        host_np = host.numpy()
        spans, end = {}, 0
        for name, array in parts.items():
            start = self.offsets[name]
            host_np[start : start + array.size] = array.reshape(-1)
            spans[name] = (start, start + array.size, array.shape)
            end = max(end, start + array.size)
        device = host
        if self.on_cuda:
            device = self.device_buffer
            device[:end].copy_(host[:end], non_blocking=True)
            self.fences.copied(slot)

        def views(buffer: torch.Tensor) -> dict[str, torch.Tensor]:
            return {name: buffer[a:b].view(shape) for name, (a, b, shape) in spans.items()}

        return views(host), views(device)


def _token_ids(rows, cached, num_new, cu, feed_index):
    """Every row's input tokens, flat (padding rows: 0), and per token the index of the
    in-flight step's output to read instead (-1: the host has it)."""
    tokens = int(cu[-1])
    ids = np.zeros(tokens, dtype=np.int64)
    feed = np.full(tokens, -1, dtype=np.int64)
    spans = zip(rows, cached.tolist(), num_new.tolist(), strict=False)
    if not feed_index:
        real = int(cu[len(rows)])
        chunks = (r.request.tokens[c : c + n] for r, c, n in spans)
        ids[:real] = np.fromiter(chain.from_iterable(chunks), dtype=np.int64, count=real)
        return ids, feed
    for i, (row, c, n) in enumerate(spans):
        known = row.request.tokens[c : c + n]
        ids[cu[i] : cu[i] + len(known)] = known
        if len(known) < n:  # only a decode row's one token can be missing
            feed[cu[i] + n - 1] = feed_index[row.request.rid]
    return ids, feed
