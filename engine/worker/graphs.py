"""The main graph runner: whole decode steps captured as CUDA graphs, one per batch bucket.

A decode step of R rows replays the graph of the smallest bucket >= R: its inputs are staged
(padded to the bucket) into the fixed device addresses the graph was captured on, FlashInfer's
decode metadata is planned into the bucket's fixed buffers, and the graph replays the forward,
the LM head and the greedy argmax. Padding rows write no K/V and run their state in the
cache's sink slot (step_inputs.py). Prefill and mixed steps run eagerly.

Capture happens once at startup, largest bucket first, all graphs sharing one memory pool; a
log line says buckets, memory and seconds. Every runner captures inside `gc_paused()`.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from engine.worker.streams import own_streams

log = logging.getLogger("engine.worker")

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collect Python's garbage now and keep the collector off while graphs capture: a cycle
    collected mid-capture may free an earlier object's CUDA resources (a graph, its memory
    pool, an event, a pinned buffer), a call CUDA refuses while a stream is capturing, which
    breaks the capture. torch.cuda.graph no longer collects before capturing, and the
    piecewise runner runs the model's Python between its captures (INVARIANTS 45)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def buckets_up_to(max_rows: int) -> list[int]:
    """The capture sizes: the table above, then steps of 64, up to max_rows inclusive."""
    sizes = [b for b in BUCKETS if b < max_rows]
    sizes += range(BUCKETS[-1] + 64, max_rows, 64)
    return [*sizes, max_rows]


@dataclass
class CapturedStep:
    graph: torch.cuda.CUDAGraph
    # [bucket, vocab] in the model's dtype, the graph's output buffer: the greedy choice needs
    # no fp32 copy (a bf16 value and its fp32 widening order alike, so their argmax is one),
    # and a sampled step widens only its own rows (Engine.launch)
    logits: torch.Tensor
    tokens: torch.Tensor | None  # [bucket] int64, each row's greedy choice (if captured)


class DecodeGraphs:
    def __init__(
        self, model, cache, ops, inputs, max_rows: int, max_pages_per_row: int,
        greedy: bool = True, stream: torch.cuda.Stream | None = None,
    ):  # fmt: skip
        """`greedy`: capture each row's argmax over the vocabulary too (a node with a logit
        mask samples its window instead, so its graphs leave that reduction out). `stream`:
        where the graphs are warmed up and captured, one no other lane captures or runs on
        (engine/worker/streams.py; default: one of its own)."""
        self.model, self.cache, self.ops, self.inputs = model, cache, ops, inputs
        self.greedy = greedy
        self.stream = stream or own_streams(next(model.parameters()).device, 1, self)[0]
        self.buckets = buckets_up_to(max_rows)
        self.steps: dict[tuple[int, int], CapturedStep] = {}  # (bucket, slot) -> graph
        start = time.perf_counter()
        free_before = torch.cuda.mem_get_info()[0]
        pool = torch.cuda.graph_pool_handle()
        self.slots = ops.attention_backend.slots
        with gc_paused():
            for bucket in reversed(self.buckets):
                ops.attention_backend.add_graph_bucket(bucket, max_pages_per_row)
                for _ in range(self.slots):  # one graph per double-buffer slot
                    slot, step = self._capture(bucket, pool)
                    self.steps[bucket, slot] = step
        used = (free_before - torch.cuda.mem_get_info()[0]) / 2**20
        log.info(
            "decode graphs: %d buckets (%s) x %d slots, %.0f MiB, %.1f s",
            len(self.buckets), ",".join(map(str, self.buckets)), self.slots, used,
            time.perf_counter() - start,
        )  # fmt: skip

    def bucket_for(self, rows: int) -> int | None:
        return next((b for b in self.buckets if b >= rows), None)

    @torch.inference_mode()
    def _capture(self, bucket: int, pool) -> tuple[int, CapturedStep]:
        batch = self.inputs.stage([], self.cache, self.ops, pad_to=bucket)
        batch.is_decode = True
        slot = self.ops.begin_step(batch, bucket)
        stream = self.stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up off the default stream, as capture needs
            for _ in range(2):
                self.model(batch, self.cache, float32=False)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            logits = self.model(batch, self.cache, float32=False)
            tokens = self.ops.argmax(logits) if self.greedy else None
        return slot, CapturedStep(graph, logits, tokens)

    def replay(self, rows, fed=None, feed_index=None) -> CapturedStep:
        """Stage and plan `rows` (a decode step) into their bucket, replay; the outputs'
        first len(rows) rows are this step's. `fed`/`feed_index`: see Engine.launch."""
        bucket = self.bucket_for(len(rows))
        batch = self.inputs.stage(rows, self.cache, self.ops, bucket, feed_index)
        batch.gather_fed_tokens(fed)
        step = self.steps[bucket, self.ops.begin_step(batch, bucket)]
        step.graph.replay()
        return step
