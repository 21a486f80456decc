"""The codec stage's step in flight (stream_stage.py): its decode queued on the device and its
PCM on its way back to the host, begun in one phase and waited for in the next.

`WindowDecoder.begin` takes a step's window codes, queues their decode (the node's `pcm`, or
with codec graphs a replay of its window-count bucket, engine/worker/codec_graphs.py) and a
non-blocking copy of their PCM into a pinned host buffer, and records an event after it; the
stage keeps what it returns, with each row's stream and window, as `PendingWindows` until the
step finishes. On CUDA the decoder runs on a stream of its own: its inputs come from the host,
so it waits for nothing of the previous node, and its PCM's copy back waits for its own work
alone, not for the step the overlapped loop launched. On a CPU the copy runs at once, and there
is no event.

Buffers: the PCM's pinned host buffers are two, used in turn, and so are the codes' in the codec
graphs (one slot names both). Overlapped (`engine.codec_overlap`) the stage begins step N+1
before it finishes N, so N+1's copy back must not land in the buffer N's copy wrote and the
host has not read yet, nor N+1's codes be staged where N's copy may still be reading
(INVARIANTS 26).

`Stream` is one request's state in the stage (its tokens, its windows taken, its input's end):
here, beside the step that holds it, so the stage and its step in flight import one way.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from engine.runtime.graph import NodeSubmodule
from engine.runtime.postprocess import StepOutput
from engine.worker.codec_graphs import CodecGraphs
from engine.worker.streams import own_streams

OPEN_STREAM = 2**40  # the tokens a stream that has not ended counts as (its loop's cap)


@dataclass
class Stream:
    rid: int
    handle: int  # the stage runtime's handle
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    windows: int = 0  # windows taken by a step (the runtime's count agrees once it finished)
    ended: str | None = None  # the previous node's finish reason, once its stream ended
    error: str | None = None  # and its error, for the stream's last frame
    # The input tokens the loop's registered cap counts: until the stream's end is taken, more
    # than any window count can reach (the loop never ends while more input may come).
    cap_tokens: int = OPEN_STREAM


@dataclass
class PendingWindows:
    """A step begun and not finished: each row's stream and window, its PCM on its way into a
    pinned host buffer (read it once `done` has fired; None on a CPU, where the copy ran at
    once), and the streams whose input ended while it was in flight."""

    streams: dict[int, Stream]  # rid -> its stream, in row order
    index: np.ndarray  # each row's window
    pcm: torch.Tensor  # host [rows, samples]
    done: torch.cuda.Event | None
    ends: list[Stream] = field(default_factory=list)  # taken after the step's frames

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()

    def live(self, held: dict[int, Stream]) -> list[int]:
        """The rows whose stream the stage still holds (not removed meanwhile, as by an abort)."""
        return [i for i, s in enumerate(self.streams.values()) if held.get(s.rid) is s]

    def output(self, live: list[int], walk: str) -> StepOutput:
        """The step's outputs for rows `live`, read once the step is waited for: each row's
        window as its token (and check_stop's `window` buffer) and its PCM as its audio."""
        rows = list(self.streams.values())
        pcm = self.pcm.numpy()
        return StepOutput(
            rids=np.array([rows[i].rid for i in live], dtype=np.int64),
            handles=np.array([rows[i].handle for i in live], dtype=np.int64),
            row_walks=[walk] * len(live),
            tokens=self.index[live],
            check_stop_buffers={"window": self.index[live]},
            audio=[pcm[i].astype("<i2").tobytes() for i in live],
        )


class WindowDecoder:
    def __init__(self, network: nn.Module, node: NodeSubmodule, capacity: int):
        """`capacity`: the streams the stage holds, the rows a PCM host buffer is sized for."""
        self.network, self.node, self.capacity = network, node, capacity
        self.device = next(network.parameters()).device
        cuda = self.device.type == "cuda"
        self.cuda_stream = own_streams(self.device, 1, self)[0] if cuda else None  # streams.py
        self.pcm_hosts: list[torch.Tensor | None] = [None, None]  # sized at first use
        self.slot = 0  # the host buffers (the PCM's here, the codes' in the graphs) next used

    def begin(
        self, codes: np.ndarray, graphs: CodecGraphs | None
    ) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """Queue the decode of a step's window codes (through `graphs` when a bucket fits) and
        the copy of their PCM to the host. Returns the host PCM [rows, samples], read once the
        event (None on a CPU) has fired."""
        slot, self.slot = self.slot, 1 - self.slot
        done = None
        with torch.cuda.stream(self.cuda_stream) if self.cuda_stream else nullcontext():
            with torch.inference_mode():
                if graphs is not None and graphs.bucket_for(len(codes)) is not None:
                    pcm = graphs.launch(codes, slot)
                else:  # from pageable memory: the driver has staged it when the call returns
                    device_codes = torch.from_numpy(codes).to(self.device, non_blocking=True)
                    pcm = self.node.pcm(self.network, device_codes)
                host = self._pcm_host(slot, pcm)
                host.copy_(pcm, non_blocking=True)
            if self.cuda_stream is not None:
                done = torch.cuda.Event()
                done.record()  # on the stage's stream, after the copy
        return host, done

    def _pcm_host(self, slot: int, pcm: torch.Tensor) -> torch.Tensor:
        """The first rows of host buffer `slot`, shaped for `pcm`; allocated (pinned on CUDA)
        for as many windows as the stage holds streams, at first use."""
        rows, samples = pcm.shape
        host = self.pcm_hosts[slot]
        if host is None or host.shape[0] < rows or host.shape[1] != samples:
            shape = (max(rows, self.capacity), samples)
            pinned = self.cuda_stream is not None
            host = self.pcm_hosts[slot] = torch.empty(shape, dtype=pcm.dtype, pin_memory=pinned)
        return host[:rows]
