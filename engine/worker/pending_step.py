"""A launched step (`PendingStep`): its rows, the device tensors it will produce, and the
non-blocking copy of its tokens to pinned host memory, which the postprocess reads
(`to_host`) once the step has finished. `to_host` waits for that copy itself: pinned memory
read before the copy lands holds whatever the host allocator's block held last (INVARIANTS 88).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.runtime.postprocess import StepOutput
from engine.worker.request import Request
from engine.worker.scheduler import ScheduledRow


@dataclass
class PendingStep:
    """A launched step: its rows, the device tensors it will produce, and (on CUDA) an event
    after the non-blocking copy of its tokens to pinned host memory."""

    rows: list[ScheduledRow]
    sampled: list[int]  # indices into rows of the rows that sampled a token
    tokens: torch.Tensor  # device [S]
    logprobs: torch.Tensor | None  # device [S] when any sampled row asked for log-probs
    requests: dict[int, Request]  # the engine's live requests, to drop rows removed since
    done: torch.cuda.Event | None = None  # None: no copy (a CPU), or the step seen complete
    host_tokens: torch.Tensor | None = None  # pinned, valid once `done` has fired
    host_logprobs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.tokens.is_cuda:  # copy back now, in stream order: a later step may reuse the
            # graph's output buffer, and waiting on the event waits for this step alone
            self.host_tokens = self.tokens.to("cpu", non_blocking=True)
            if self.logprobs is not None:
                self.host_logprobs = self.logprobs.float().to("cpu", non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record()

    def wait(self) -> None:
        """Block until the step and its tokens' copy completed (at once when seen complete before)."""
        if self.done is not None:
            self.done.synchronize()
            self.done = None  # seen complete: later waits and queries ask the driver nothing

    def finished(self) -> bool:
        """Whether the step (and its tokens' copy) completed: the host may read it now."""
        if self.done is not None and self.done.query():
            self.done = None
        return self.done is None

    def feed_index(self) -> dict[int, int]:
        """rid -> index of its token in `tokens`: where the next step reads a token the host
        does not have yet (the overlapped loop)."""
        return {self.rows[i].request.rid: j for j, i in enumerate(self.sampled)}

    def to_host(self) -> StepOutput:
        """The stop check's host copy (the postprocess's `prematerialize`). Rows whose request
        was removed after this step was launched (stopped by the previous step's postprocess,
        or aborted) are dropped: they never reach the postprocess. Waits for the step first
        (a no-op after `wait` or a `finished` that said yes)."""
        self.wait()
        tokens = self.host_tokens if self.host_tokens is not None else self.tokens.cpu()
        logprobs = self.host_logprobs if self.host_logprobs is not None else self.logprobs
        keep = [
            j for j, i in enumerate(self.sampled)
            if self.requests.get(self.rows[i].request.rid) is self.rows[i].request
        ]  # fmt: skip
        rows = [self.rows[self.sampled[j]] for j in keep]
        tokens = tokens.numpy().astype(np.int64, copy=False)
        if len(keep) < len(self.sampled):
            tokens = tokens[keep]
            logprobs = None if logprobs is None else logprobs[keep]
        return StepOutput(
            rids=np.fromiter((r.request.rid for r in rows), dtype=np.int64, count=len(rows)),
            handles=np.fromiter((r.request.handle for r in rows), dtype=np.int64, count=len(rows)),
            row_walks=[r.walk for r in rows],
            tokens=tokens,
            logprobs=None if logprobs is None else logprobs.float().cpu().numpy(),
            check_stop_buffers={"new_token": tokens},
        )
