"""A launched step's host copy (`PendingStep.to_host`) is read only once the copy landed
(INVARIANTS 88). On CUDA the tokens reach pinned host memory by a non-blocking copy; read
before it lands, that memory holds whatever the host allocator's block held last. Here a
stand-in event plays the copy: the host buffer holds stale values until `synchronize`."""

from __future__ import annotations

import numpy as np
import torch

from engine.layers.sampler import SamplingParams
from engine.worker.pending_step import PendingStep
from engine.worker.request import Request
from engine.worker.scheduler import ScheduledRow


class _Copy:
    """A CUDA event after a non-blocking D2H copy: the copy lands when the host waits for it
    (`synchronize`), or when a `query` finds it done (after `ready_after` queries)."""

    def __init__(self, source: torch.Tensor, target: torch.Tensor, ready_after: int = 0):
        self.source, self.target, self.ready_after = source, target, ready_after
        self.syncs = self.queries = 0

    def synchronize(self) -> None:
        self.syncs += 1
        self.target.copy_(self.source)

    def query(self) -> bool:
        self.queries += 1
        if self.queries > self.ready_after:
            self.target.copy_(self.source)
            return True
        return False


def _pending(ready_after: int = 0) -> tuple[PendingStep, _Copy]:
    requests = {}
    rows = []
    for rid in range(3):
        request = Request(rid, [1, 2, 3], 8, True, SamplingParams(temperature=0), rid)
        request.handle = 10 + rid
        requests[rid] = request
        rows.append(ScheduledRow(request, 1, "decode"))
    tokens = torch.tensor([7, 8, 9])
    pending = PendingStep(rows, [0, 1, 2], tokens, None, requests)
    pending.host_tokens = torch.full((3,), -1)  # the pinned block's stale contents
    pending.done = copy = _Copy(tokens, pending.host_tokens, ready_after)
    return pending, copy


def test_the_host_copy_waits_for_the_step_it_reads():
    """Called without `wait` first (as tests and benchmarks driving an engine by hand did),
    `to_host` still reads the step's tokens, not the buffer's stale values."""
    pending, copy = _pending()
    out = pending.to_host()
    assert out.tokens.tolist() == [7, 8, 9]
    assert out.rids.tolist() == [0, 1, 2] and out.handles.tolist() == [10, 11, 12]
    assert copy.syncs == 1


def test_a_step_seen_complete_asks_the_driver_nothing_more():
    """The worker waits (or polls `finished`) before its host copy: `to_host` then waits for
    nothing, and later waits and polls ask the event nothing (one synchronize a step)."""
    pending, copy = _pending()
    pending.wait()
    pending.wait()
    assert pending.finished()
    assert np.array_equal(pending.to_host().tokens, [7, 8, 9])
    assert (copy.syncs, copy.queries) == (1, 0)

    pending, copy = _pending(ready_after=2)  # a prefill step polled by the worker
    assert not pending.finished() and not pending.finished()
    assert pending.finished() and pending.finished()
    assert pending.to_host().tokens.tolist() == [7, 8, 9]
    assert (copy.syncs, copy.queries) == (0, 3)
