"""The codec's graph runner: a stream node's decode (window codes -> the PCM it keeps) captured
as CUDA graphs, one per window-count bucket.

The codec decodes a step's ready windows in one batch, and eagerly that is many small
convolution launches, host-bound (Orpheus 3b on an H200: 4.4 ms of a 7.4 ms worker iteration).
So the runner captures the node's `pcm(network, codes)` once per bucket (1, 2, 4, 8, 16, 24,
32, 48, 64, ... up to the scenario's `max_rows`, graphs.py's table) on one static input buffer.
A step of B windows (`launch`) writes their codes into the first B rows of a pinned host
buffer, code 0 (a valid code) into the rest of its bucket, sends them with one non-blocking
copy into the static buffer, replays the bucket's graph and returns the first B rows of its
output, on the device; the stage copies them back (stream_pending.py). Steps of more windows
than the largest bucket run eagerly.

Padding: the SNAC decoder works within a row (engine/models/snac.py, SnacDecoder.decode: no
batch statistics, no state between calls), so the padding rows' samples are computed and
dropped and never reach a real row.

Streams and buffers: the stage decodes on a CUDA stream of its own (stream_pending.py); the
runner captures on that stream and the stage replays on it, so the input copy, the replay and
the copy back are ordered on it alone. The pinned input buffers are two, used in turn (the
caller names the slot): with `engine.codec_overlap` no blocking copy ends a step, so staging a
step must not rewrite the buffer the previous step's copy may still be reading (INVARIANTS 26).
A bucket's output buffer is rewritten by that bucket's next replay, which is queued on the same
stream after this step's copy out: stream order protects it.

Without a stream (a CPU, or a test) nothing is captured: each bucket runs the forward
eagerly on the same padded buffers, the eager twin of a replay that the CPU suite checks
against decoding the windows directly (tests/test_orpheus.py).

Capture happens once at startup, largest bucket first, all graphs sharing one memory pool; a
log line says buckets, memory and seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import torch

from engine.worker.graphs import buckets_up_to, gc_paused

log = logging.getLogger("engine.worker")

CodecForward = Callable[[torch.Tensor], torch.Tensor]  # codes [B, width] -> int16 PCM [B, S]


class CodecGraphs:
    def __init__(
        self,
        forward: CodecForward,
        code_width: int,
        max_windows: int,
        device: torch.device,
        stream: torch.cuda.Stream | None = None,
    ):
        """`forward`: the node's device decode (SnacNode.pcm on its network), the same for
        every bucket; `code_width`: a window's codes; `stream`: capture on it (CUDA), or
        None for the eager twin."""
        if max_windows < 1:
            raise ValueError(f"codec graphs need max_windows >= 1, got {max_windows}")
        self.forward = forward
        self.buckets = buckets_up_to(max_windows)
        size = (self.buckets[-1], code_width)
        self.codes = torch.zeros(size, dtype=torch.int64, device=device)  # the static input
        pinned = device.type == "cuda"
        self.hosts = [torch.zeros(size, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if stream is not None:
            self._capture_all(stream)

    def bucket_for(self, windows: int) -> int | None:
        return next((b for b in self.buckets if b >= windows), None)

    @torch.inference_mode()
    def launch(self, codes: np.ndarray, slot: int) -> torch.Tensor:
        """Codes [B, width] of B windows (1 <= B <= the largest bucket) -> their PCM, int16
        [B, S] on the device, queued: staged in pinned buffer `slot` (0 or 1, in turn), padded
        to the bucket, replayed (or run eagerly without graphs), the first B rows kept. Call it
        on the stream the graphs were captured on."""
        windows = len(codes)
        bucket = self.bucket_for(windows)
        if windows < 1 or bucket is None:
            raise ValueError(f"{windows} windows: the codec graphs take 1 to {self.buckets[-1]}")
        host = self.hosts[slot]
        host[:windows] = torch.from_numpy(codes)
        host[windows:bucket] = 0
        self.codes[:bucket].copy_(host[:bucket], non_blocking=True)
        if bucket in self.graphs:
            graph, pcm = self.graphs[bucket]
            graph.replay()  # into the bucket's output buffer: see "Streams and buffers"
        else:
            pcm = self.forward(self.codes[:bucket])
        return pcm[:windows]

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """`launch`, then the PCM on the host (a blocking copy): what the tests compare."""
        return self.launch(codes, 0).cpu().numpy()

    def _capture_all(self, stream: torch.cuda.Stream) -> None:
        start = time.perf_counter()
        free_before = torch.cuda.mem_get_info()[0]
        pool = torch.cuda.graph_pool_handle()
        with gc_paused():
            for bucket in reversed(self.buckets):
                self.graphs[bucket] = self._capture(bucket, pool, stream)
        used = (free_before - torch.cuda.mem_get_info()[0]) / 2**20
        log.info(
            "codec graphs: %d buckets (%s), %.0f MiB, %.1f s",
            len(self.buckets), ",".join(map(str, self.buckets)), used,
            time.perf_counter() - start,
        )  # fmt: skip

    @torch.inference_mode()
    def _capture(self, bucket: int, pool, stream: torch.cuda.Stream):
        codes = self.codes[:bucket]  # zeros: valid codes
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up (cuDNN's choices) where the capture runs
            for _ in range(2):
                self.forward(codes)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            pcm = self.forward(codes)
        return graph, pcm
