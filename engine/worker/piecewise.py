"""The piecewise graph runner: prefill and mixed steps on CUDA graphs, split at the ops that
cannot be captured.

A prefill or mixed step's shapes change with its rows (how many, how long), and two of its
ops plan on the host from exactly that: attention (FlashInfer's prefill plan over the rows'
pages) and Gated DeltaNet (the varlen conv and flash-linear-attention's chunked kernel, whose
grid is sized from the rows on the host). Everything else in the model's body is token-wise
(embedding, rotary, projections, norms, gates, MLPs): its shapes depend on the token count
alone. So the runner pads the step's tokens to a bucket and captures, per bucket, the body as
a chain of graphs broken at every attention and Gated DeltaNet op:

    piece 0 | attention or GDN op, eager | piece 1 | op | ... | piece n

A replay runs the chain: each piece's graph, then its op eagerly on the step's real tokens (the
first T of the bucket), the op's output copied into the fixed buffer the next piece reads. The
LM head runs eagerly on each row's last token (the row count varies).

How the splits are found: the model's body runs once under capture with its ops routed through
a recorder (`_Splitter`), which ends the graph being captured when the model calls a split op,
runs the op, and begins the next graph. The model code is unchanged and knows nothing of it.

Padding tokens (after the step's real tokens) have id 0 and position 0 and store no K/V; they
belong to no row, never reach a split op, and each token-wise piece keeps them to their own
rows of every buffer, so what they compute is never read.

Double buffering: the pieces read only the step inputs' one device buffer (written in stream
order); the staged host buffers behind it and FlashInfer's per-slot wrappers, planned eagerly
for the split ops, are the step inputs' and the attention backend's own double buffers
(`force_double_buffer`), which the runner checks at startup like the decode runner.

Capturing Gated DeltaNet too (`engine.piecewise_gdn`): where the ops declare their
`linear_attention` capturable, it is no split op for this runner. Each step then stages Gated
DeltaNet's row and chunk tables with its inputs (fixed addresses), and the op, called inside
a piece on the bucket's tokens, launches its kernels on grids set by the bucket, reading the
step's counts and tables from the device (triton_gdn.gated_delta_fixed_grid). Only attention
stays eager: 0.8b's 25 pieces become 7.

Capture happens once at startup, largest bucket first, all buckets sharing one memory pool; a
log line says buckets, pieces, memory and seconds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from engine.worker.graphs import gc_paused
from engine.worker.streams import own_streams

log = logging.getLogger("engine.worker")

TOKEN_BUCKETS = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)

# The ops a piece may end at (which of them do: `split_ops`, per runner), and the positions
# of their token-axis arguments (the rest are caches, layers, the batch and constants).
SPLIT_OPS = {"attention": (0, 1, 2), "linear_attention": (1, 2, 3)}
BATCH_ARG = {"attention": 5, "linear_attention": 6}


def token_buckets_up_to(max_tokens: int) -> list[int]:
    return [*(b for b in TOKEN_BUCKETS if b < max_tokens), max_tokens]


def split_ops(ops) -> tuple[str, ...]:
    """The ops the pieces end at: SPLIT_OPS, less Gated DeltaNet where the ops declare it
    capturable (it then runs inside the pieces on the step's staged tables)."""
    if getattr(ops, "linear_attention_capturable", False):
        return ("attention",)
    return tuple(SPLIT_OPS)


@dataclass
class Split:
    """One eager op between two pieces: its name, its arguments as captured (token tensors
    are the fixed buffers the previous piece wrote) and the buffer its output goes to."""

    name: str
    args: tuple
    out: torch.Tensor

    def run(self, ops, batch, tokens: int) -> None:
        """The op on the step's first `tokens` tokens (the real ones), into `out`."""
        result = getattr(ops, self.name)(*_real_args(self.name, self.args, tokens, batch))
        self.out[:tokens].copy_(result)


@dataclass
class CapturedBody:
    """One bucket's chain: graphs[i] then splits[i] (the last graph has no split after it),
    and the buffers of the body's outputs."""

    graphs: list[torch.cuda.CUDAGraph] = field(default_factory=list)
    splits: list[Split] = field(default_factory=list)
    hidden: torch.Tensor | None = None  # [bucket, hidden]
    residual: torch.Tensor | None = None


class _Splitter:
    """The ops of a step padded to a bucket: every op as the real backend's, except the split
    ops, which run on the real tokens alone into a bucket-sized buffer; while capturing
    (`pool` given) they also close the graph being captured and open the next one."""

    def __init__(self, ops, batch, tokens: int, body: CapturedBody, pool=None):
        self._ops, self._batch, self._tokens = ops, batch, tokens
        self._body, self._pool = body, pool
        self._splits = split_ops(ops)

    def __getattr__(self, name: str):
        real = getattr(self._ops, name)
        if name not in self._splits:
            return real
        return lambda *args: self._split(name, args)

    def begin(self) -> None:
        if self._pool is not None:
            graph = torch.cuda.CUDAGraph()
            self._body.graphs.append(graph)
            graph.capture_begin(pool=self._pool)

    def end(self) -> None:
        if self._pool is not None:
            self._body.graphs[-1].capture_end()

    def _split(self, name: str, args: tuple) -> torch.Tensor:
        self.end()
        real = getattr(self._ops, name)(*_real_args(name, args, self._tokens, self._batch))
        # outside the pool: lives as long as the runner; zeros, so padding rows stay finite
        out = real.new_zeros((args[SPLIT_OPS[name][0]].shape[0], *real.shape[1:]))
        out[: self._tokens].copy_(real)
        self._body.splits.append(Split(name, args, out))
        self.begin()
        return out


def trace_body(model, cache, ops, batch, tokens: int, body: CapturedBody, pool=None):
    """Run the model's body on `batch` (its first `tokens` tokens real, the rest padding to a
    bucket) with the split ops on the real tokens alone; with `pool`, capturing the pieces
    between them into `body.graphs`. Without it, the eager twin of a replay (tests)."""
    splitter = _Splitter(ops, batch, tokens, body, pool)
    batch.ops = splitter
    try:
        splitter.begin()
        body.hidden, body.residual = model.hidden_states(batch, cache)
        splitter.end()
    finally:
        batch.ops = ops
    return body


def _real_args(name: str, args: tuple, tokens: int, batch) -> list:
    """A split op's arguments for one step: its token tensors cut to the real tokens, and
    that step's batch."""
    out = list(args)
    for i in SPLIT_OPS[name]:
        out[i] = out[i][:tokens]
    out[BATCH_ARG[name]] = batch
    return out


class PiecewiseGraphs:
    def __init__(self, model, cache, ops, inputs, max_tokens: int, stream=None):
        """`stream`: where the pieces are warmed up and captured: the stream they replay on
        beside another lane (the prefill stream), or one of their own (streams.py)."""
        self.model, self.cache, self.ops, self.inputs = model, cache, ops, inputs
        self.stream = stream or own_streams(next(model.parameters()).device, 1, self)[0]
        self.buckets = token_buckets_up_to(max_tokens)
        self.gdn_captured = "linear_attention" not in split_ops(ops)
        self.bodies: dict[int, CapturedBody] = {}
        start = time.perf_counter()
        free_before = torch.cuda.mem_get_info()[0]
        pool = torch.cuda.graph_pool_handle()
        with gc_paused():
            for bucket in reversed(self.buckets):
                self.bodies[bucket] = self._capture(bucket, pool)
        used = (free_before - torch.cuda.mem_get_info()[0]) / 2**20
        pieces = len(self.bodies[self.buckets[0]].graphs)
        log.info(
            "piecewise graphs: %d token buckets (%s), %d pieces each (split at %s), %.0f MiB, "
            "%.1f s", len(self.buckets), ",".join(map(str, self.buckets)), pieces,
            " and ".join(split_ops(ops)), used, time.perf_counter() - start,
        )  # fmt: skip

    def bucket_for(self, tokens: int) -> int | None:
        return next((b for b in self.buckets if b >= tokens), None)

    @torch.inference_mode()
    def _capture(self, bucket: int, pool) -> CapturedBody:
        # One sink row of one token, padded to the bucket: the split ops do valid work on the
        # sink page and slot while capturing; the pieces see only the token count.
        batch = self.inputs.stage(
            [], self.cache, self.ops, pad_to=1, pad_tokens_to=bucket, gdn_tables=self.gdn_captured
        )
        self.ops.begin_step(batch)
        stream = self.stream
        stream.wait_stream(torch.cuda.current_stream())
        body = CapturedBody()
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up (Triton, cuBLAS) off the default stream
                trace_body(self.model, self.cache, self.ops, batch, 1, CapturedBody())
            torch.cuda.synchronize()
            trace_body(self.model, self.cache, self.ops, batch, 1, body, pool)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        return body

    def run(self, rows, fed=None, feed_index=None) -> torch.Tensor:
        """Stage `rows` (any step whose tokens fit a bucket) padded to their bucket, plan,
        replay the chain; returns the float32 logits of each row's last token.
        `fed`/`feed_index`: see Engine.launch."""
        tokens = sum(r.num_new for r in rows)
        bucket = self.bucket_for(tokens)
        batch = self.inputs.stage(
            rows, self.cache, self.ops, feed_index=feed_index, pad_tokens_to=bucket,
            gdn_tables=self.gdn_captured,
        )  # fmt: skip
        batch.gather_fed_tokens(fed)
        self.ops.begin_step(batch)
        body = self.bodies[bucket]
        for i, graph in enumerate(body.graphs):
            graph.replay()
            if i < len(body.splits):
                body.splits[i].run(self.ops, batch, tokens)
        return self.model.logits_at(body.hidden, body.residual, batch.last_token_index, self.ops)
