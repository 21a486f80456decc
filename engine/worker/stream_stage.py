"""A node fed the previous node's token stream, on the same worker (Orpheus's SNAC codec).

The stage keeps each request's stream: the tokens the previous node sent so far, how many
windows it has decoded, and whether (and why) the stream ended. One step decodes the next
ready window of every request that has one, all in one batch, then runs the node's phased
postprocess over its own runtime: the node's walk, its loop count (windows decoded), the
stop policy it declares (ITER over the windows the stream makes: its cap is registered
open when the request arrives, and exact when the stream ends, so the loop ends when its
input has ended and its last window is decoded; then the partition ends).

The stage is generic over a windowed node: it reads the node's `window_tokens`, `hop_tokens`,
`windows_for(tokens)` and `decode(network, windows)`; the node's step emits each row's PCM.
With codec graphs (`engine.codec_graphs`, CUDA only) a step replays the node's `pcm` captured
per window-count bucket instead, its windows' `codes` padded to the bucket
(engine/worker/codec_graphs.py).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from torch import nn

from engine.messages import AddRequest, TokenFrame
from engine.runtime.graph import NodeSubmodule, StopCheck
from engine.runtime.postprocess import PhasedPostprocess, StepOutput
from engine.runtime.runtime import GraphRuntime
from engine.spans import NodeSpans
from engine.worker.codec_graphs import CodecGraphs
from engine.worker.node_postprocess import postprocess_step, stop_rows
from engine.worker.timing import PhaseTimer, now_ns

OPEN_STREAM = 2**40  # the tokens a stream that has not ended counts as (its loop's cap)


@dataclass
class Stream:
    rid: int
    handle: int  # the stage runtime's handle
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    windows: int = 0  # windows decoded (the runtime's loop count agrees)
    ended: str | None = None  # the previous node's finish reason, once its stream ended

    @property
    def expected(self) -> int:
        """The tokens the stream has, once it ended; until then, more than any window count
        can reach: the node's loop never ends while more input may come."""
        return len(self.tokens) if self.ended else OPEN_STREAM


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
    ):
        """`graphs`: replay the node's decode as CUDA graphs (on a CUDA device; ignored on a
        CPU) for steps of up to `max_windows` windows; larger steps run eagerly."""
        self.network, self.node, self.timer = network, node, timer
        self.runtime_stops = runtime_stops
        self.runtime = GraphRuntime(node.graph, capacity)
        for walk in node.graph.walks:  # declared once, at startup
            self.runtime.declare_stop_policies(walk, node.get_stop_policies(walk))
        self.postprocess = PhasedPostprocess(self.runtime)
        self.walk = node.graph.walks[0]
        self.spans = NodeSpans.of(node.graph.node)
        self.streams: dict[int, Stream] = {}
        # On CUDA the stage decodes on a stream of its own: its inputs come from the host, so
        # it waits for nothing of the previous node, and the blocking copy of its PCM back
        # waits for its own work alone, not for the step the overlapped loop launched.
        device = next(network.parameters()).device
        self.cuda_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.graphs = None
        if graphs and self.cuda_stream is not None:
            self.graphs = CodecGraphs(
                partial(node.pcm, network), node.code_width, max_windows, device, self.cuda_stream
            )

    # --- requests ------------------------------------------------------------------------
    def add_request(self, msg: AddRequest) -> None:
        handle = self.runtime.add_request(msg.rid)
        stream = Stream(msg.rid, handle, len(msg.prompt))
        self.streams[msg.rid] = stream
        self._register_limits(stream)

    def _register_limits(self, stream: Stream) -> None:
        for walk, limits in self.node.stop_limits(stream.expected, False).items():
            self.runtime.register_limits(stream.handle, walk, limits)

    def holds(self, rid: int) -> bool:
        return rid in self.streams

    def remove(self, rid: int) -> None:
        if self.streams.pop(rid, None) is not None:
            self.runtime.remove_request(rid)

    def feed(self, frames: list[TokenFrame]) -> list[TokenFrame]:
        """The previous node's frames in. Returns the last frames of streams that ended with
        no window left to decode (their partition ends here) and of failed ones."""
        done = []
        for frame in frames:
            stream = self.streams.get(frame.rid)
            if stream is None:  # aborted: its partition ended
                continue
            stream.tokens.extend(frame.tokens)
            if frame.finish_reason is None:
                continue
            stream.ended = frame.finish_reason
            if frame.finish_reason != "error":
                self._register_limits(stream)  # the window count, exact now
                if stream.windows < self.node.windows_for(len(stream.tokens)):
                    continue
            done.append(self._last_frame(stream, frame.error))
            self.remove(frame.rid)
        return done

    def _last_frame(self, stream: Stream, error: str | None = None) -> TokenFrame:
        return TokenFrame(
            stream.rid, [], finish_reason=stream.ended, prompt_tokens=stream.prompt_tokens,
            error=error, audio=b"",
        )  # fmt: skip

    # --- one step ------------------------------------------------------------------------
    def ready(self) -> list[Stream]:
        windows_for = self.node.windows_for
        return [s for s in self.streams.values() if s.windows < windows_for(len(s.tokens))]

    def has_work(self) -> bool:
        return bool(self.ready())

    def step(self, emit: Callable[[list[TokenFrame]], None]) -> int:
        """Decode every ready stream's next window together, postprocess, `emit` the frames;
        returns the rows decoded (0: nothing was ready)."""
        ready = self.ready()
        if not ready:
            return 0
        timing = self.timer.enabled
        t0 = now_ns() if timing else 0
        window, hop = self.node.window_tokens, self.node.hop_tokens
        index = np.array([s.windows for s in ready], dtype=np.int64)
        windows = np.array([s.tokens[s.windows * hop : s.windows * hop + window] for s in ready])
        with torch.cuda.stream(self.cuda_stream) if self.cuda_stream else nullcontext():
            if self.graphs is not None and self.graphs.bucket_for(len(ready)) is not None:
                pcm = self.graphs.decode(self.node.codes(windows))
            else:
                pcm = self.node.decode(self.network, windows)
        out = StepOutput(
            rids=np.array([s.rid for s in ready], dtype=np.int64),
            handles=np.array([s.handle for s in ready], dtype=np.int64),
            row_walks=[self.walk] * len(ready),
            tokens=index,
            check_stop_buffers={"window": index},
            audio=[row.astype("<i2").tobytes() for row in pcm],
        )
        for stream in ready:  # the step's outputs are taken: this window counts
            stream.windows += 1
        t1 = now_ns() if timing else 0
        result = postprocess_step(
            self.postprocess, out, self, self.runtime_stops, self.timer, self.spans
        )
        t2 = now_ns() if timing else 0
        for frame in result.frames:  # a stream that ended on EOS ends its reply with "stop"
            if frame.finish_reason is not None and frame.finish_reason != "error":
                frame.finish_reason = self.streams[frame.rid].ended or frame.finish_reason
        for rid in result.finished + result.failed:
            self.remove(rid)
        emit(result.frames)
        if timing:
            t3 = now_ns()
            self.timer.span(self.spans.forward, t1 - t0)
            self.timer.span(self.spans.tail, t3 - t2)
            self.timer.span(self.spans.postprocess_batch, t3 - t1)
            self.timer.count(self.spans.rows_per_step, len(ready))
        return len(ready)

    # --- what the postprocess asks of the node (node_postprocess.NodeHandlers) ----------
    def check_stop(self, out: StepOutput, rows: np.ndarray) -> StopCheck:
        streams = [self.streams[int(out.rids[i])] for i in rows]
        counts, expected = [s.windows for s in streams], [s.expected for s in streams]
        return self.node.check_stop(stop_rows(out, rows, counts, expected, [False] * len(rows)))

    def prompt_tokens(self, rid: int) -> int:
        return self.streams[rid].prompt_tokens
