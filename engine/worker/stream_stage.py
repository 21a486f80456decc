"""A node fed the previous node's token stream, on the same worker (Orpheus's SNAC codec).

The stage keeps each request's stream: the tokens the previous node sent so far, how many
windows it has taken, and whether (and why) the stream ended. One step decodes the next ready
window of every request that has one, all in one batch, then runs the node's phased
postprocess over its own runtime: the node's walk, its loop count (windows decoded), the
stop policy it declares (ITER over the windows the stream makes: its cap is registered
open when the request arrives, and exact when the stream ends, so the loop ends when its
input has ended and its last window is decoded; then the partition ends).

A step has two phases. `begin` takes the ready windows (each stream's count moves on) and
queues their decode and their PCM's copy back to the host (stream_pending.py: the step in
flight, its pinned host buffers); `finish` waits for it and does the rest: the step's outputs,
the postprocess, the frames out, finished streams out. Strict (the default) a step finishes as
soon as it begins, so the host waits out the codec's device work. With `engine.codec_overlap`
it finishes at the stage's next `step`, one worker iteration later, the host having done the
next LLM launch and postprocess meanwhile; each `step` begins the next step first, as the LLM's
overlapped loop launches N+1 before postprocessing N, so two steps are in flight until the
older finishes, each with its own pinned host buffers (INVARIANTS 26). What the stage emits is
the strict stage's (INVARIANTS 48): an input's end that arrives while its stream's window is in
flight is taken when that step finishes, after its frames (the strict stage had finished the
step when the end came), and the last frame waits for a window still in flight; a stream
removed meanwhile (an abort) loses its rows.

The stage is generic over a windowed node: it reads the node's `window_tokens`, `hop_tokens`,
`windows_for(tokens)`, `codes(windows)` (on the host) and `pcm(network, codes)` (on the
device); the node's step emits each row's PCM. With codec graphs (`engine.codec_graphs`, CUDA
only) a step replays the node's `pcm` captured per window-count bucket instead, its windows'
`codes` padded to the bucket (engine/worker/codec_graphs.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
from torch import nn

from engine.messages import AddRequest, TokenFrame
from engine.runtime.graph import NodeSubmodule, StopCheck
from engine.runtime.postprocess import PhasedPostprocess, StepOutput
from engine.runtime.runtime import GraphRuntime
from engine.spans import NodeSpans
from engine.worker.codec_graphs import CodecGraphs
from engine.worker.node_postprocess import postprocess_step, stop_rows
from engine.worker.stream_pending import PendingWindows, Stream, WindowDecoder
from engine.worker.timing import PhaseTimer, now_ns


class StreamStage:
    def __init__(
        self,
        network: nn.Module,
        node: NodeSubmodule,
        timer: PhaseTimer,
        capacity: int,
        runtime_stops: bool = True,
        graphs: bool = False,
        max_windows: int = 256,
        overlap: bool = False,
    ):
        """`graphs`: replay the node's decode as CUDA graphs (on a CUDA device; ignored on a
        CPU) for steps of up to `max_windows` windows; larger steps run eagerly. `overlap`:
        finish each step at the next `step` instead of at once (`engine.codec_overlap`)."""
        self.network, self.node, self.timer = network, node, timer
        self.capacity, self.runtime_stops, self.overlap = capacity, runtime_stops, overlap
        self.runtime = GraphRuntime(node.graph, capacity)
        for walk in node.graph.walks:  # declared once, at startup
            self.runtime.declare_stop_policies(walk, node.get_stop_policies(walk))
        self.postprocess = PhasedPostprocess(self.runtime)
        self.walk = node.graph.walks[0]
        self.spans = NodeSpans.of(node.graph.node)
        self.streams: dict[int, Stream] = {}
        self.pending: PendingWindows | None = None  # begun, finished at the next step
        # Its device side: the decode on a CUDA stream of its own and the PCM's host buffers.
        self.decoder = WindowDecoder(network, node, capacity)
        self.device, self.cuda_stream = self.decoder.device, self.decoder.cuda_stream
        self.graphs = None
        if graphs and self.cuda_stream is not None:
            self.graphs = CodecGraphs(
                partial(node.pcm, network), node.code_width, max_windows, self.device,
                self.cuda_stream,
            )  # fmt: skip

    # --- requests ------------------------------------------------------------------------
    def add_request(self, msg: AddRequest) -> None:
        handle = self.runtime.add_request(msg.rid)
        stream = Stream(msg.rid, handle, len(msg.prompt))
        self.streams[msg.rid] = stream
        self._register_limits(stream)

    def _register_limits(self, stream: Stream) -> None:
        for walk, limits in self.node.stop_limits(stream.cap_tokens, False).items():
            self.runtime.register_limits(stream.handle, walk, limits)

    def holds(self, rid: int) -> bool:
        return rid in self.streams

    def remove(self, rid: int) -> None:
        if self.streams.pop(rid, None) is not None:
            self.runtime.remove_request(rid)

    def feed(self, frames: list[TokenFrame]) -> list[TokenFrame]:
        """The previous node's frames in. Returns the last frames of streams that ended with
        no window left to decode (their partition ends here) and of failed ones. The end of a
        stream whose window is in flight waits for that step's finish."""
        done = []
        for frame in frames:
            stream = self.streams.get(frame.rid)
            if stream is None:  # aborted: its partition ended
                continue
            stream.tokens.extend(frame.tokens)
            if frame.finish_reason is None:
                continue
            stream.ended, stream.error = frame.finish_reason, frame.error
            if self._in_flight(stream):
                self.pending.ends.append(stream)
            else:
                done += self._take_end(stream)
        return done

    def _take_end(self, stream: Stream) -> list[TokenFrame]:
        """The stream's input ended: its loop's cap is exact now. Its last frame (and the
        stream out) when it failed, or when no window is left to decode nor in flight (a
        window in flight ends the loop at its step's finish, the cap exact by then)."""
        if stream.ended != "error":
            stream.cap_tokens = len(stream.tokens)
            self._register_limits(stream)
            left = stream.windows < self.node.windows_for(len(stream.tokens))
            if left or self._in_flight(stream):
                return []
        self.remove(stream.rid)
        return [self._last_frame(stream)]

    def _in_flight(self, stream: Stream) -> bool:
        """A window of the stream is in the step begun last, not finished yet."""
        return self.pending is not None and self.pending.streams.get(stream.rid) is stream

    def _last_frame(self, stream: Stream) -> TokenFrame:
        return TokenFrame(
            stream.rid, [], finish_reason=stream.ended, prompt_tokens=stream.prompt_tokens,
            error=stream.error, audio=b"",
        )  # fmt: skip

    # --- one step ------------------------------------------------------------------------
    def ready(self) -> list[Stream]:
        """Streams with a window to decode; not a failed one whose end waits for its window in
        flight: the strict stage would have dropped it, and a step's batch is the strict one's."""
        windows_for = self.node.windows_for
        return [
            s for s in self.streams.values()
            if s.windows < windows_for(len(s.tokens)) and s.ended != "error"
        ]  # fmt: skip

    def has_work(self) -> bool:
        return self.pending is not None or bool(self.ready())

    def step(self, emit: Callable[[list[TokenFrame]], None]) -> int:
        """Begin a step over every ready stream's next window, then finish the step in flight
        (overlapped: begun at the last `step`; strict: the one just begun); `emit` takes each
        finished step's frames. Returns the rows begun and finished (0: nothing to do)."""
        previous, self.pending = self.pending, self._begin()
        rows = len(self.pending.streams) if self.pending is not None else 0
        if previous is not None:  # two steps in flight until it finishes: their buffers apart
            rows += self._finish(previous, emit)
        if not self.overlap and self.pending is not None:
            begun, self.pending = self.pending, None
            self._finish(begun, emit)
        return rows

    def _begin(self) -> PendingWindows | None:
        """Take every ready stream's next window, queue their decode and the copy of their
        PCM to the host; None when nothing is ready."""
        ready = self.ready()
        if not ready:
            return None
        timing = self.timer.enabled
        t0 = now_ns() if timing else 0
        window, hop = self.node.window_tokens, self.node.hop_tokens
        index = np.array([s.windows for s in ready], dtype=np.int64)
        windows = np.array([s.tokens[s.windows * hop : s.windows * hop + window] for s in ready])
        pcm, done = self.decoder.begin(self.node.codes(windows), self.graphs)
        for stream in ready:  # taken: the next step takes each stream's next window
            stream.windows += 1
        if timing:
            self.timer.span(self.spans.forward, now_ns() - t0)
            self.timer.count(self.spans.rows_per_step, len(ready))
        return PendingWindows({s.rid: s for s in ready}, index, pcm, done)

    def _finish(self, pending: PendingWindows, emit: Callable[[list[TokenFrame]], None]) -> int:
        """Wait for a begun step's PCM, postprocess its rows, `emit` their frames (then the
        last frames of the ends that arrived while it was in flight); returns its rows."""
        timing = self.timer.enabled
        t0 = now_ns() if timing else 0
        pending.wait()
        t1 = now_ns() if timing else 0
        live = pending.live(self.streams)
        frames: list[TokenFrame] = []
        if live:
            out = pending.output(live, self.walk)
            result = postprocess_step(
                self.postprocess, out, self, self.runtime_stops, self.timer, self.spans
            )
            frames = result.frames
            for frame in frames:  # a stream that ended on EOS ends its reply with "stop"
                if frame.finish_reason is not None and frame.finish_reason != "error":
                    frame.finish_reason = self.streams[frame.rid].ended or frame.finish_reason
            for rid in result.finished + result.failed:
                self.remove(rid)
        t2 = now_ns() if timing else 0
        for stream in pending.ends:  # as the strict stage takes them: after the step's frames
            if self.streams.get(stream.rid) is stream:
                frames += self._take_end(stream)
        emit(frames)
        if timing:
            t3 = now_ns()
            self.timer.span(self.spans.completion_wait, t1 - t0)
            self.timer.span(self.spans.tail, t3 - t2)
            self.timer.span(self.spans.postprocess_batch, t3 - t0)
        return len(pending.streams)

    # --- what the postprocess asks of the node (node_postprocess.NodeHandlers) ----------
    def check_stop(self, out: StepOutput, rows: np.ndarray) -> StopCheck:
        """`output_counts`: the windows decoded, this row's included; `max_tokens`: the input
        tokens the registered cap counts."""
        caps = [self.streams[int(out.rids[i])].cap_tokens for i in rows]
        counts = out.tokens[rows] + 1
        return self.node.check_stop(stop_rows(out, rows, counts, caps, [False] * len(rows)))

    def prompt_tokens(self, rid: int) -> int:
        return self.streams[rid].prompt_tokens
