"""A double-buffered host resource's fences: per slot, an event after the last non-blocking
copy that read the slot's pinned host memory (the step inputs' buffers, FlashInfer's plans).

Writing a slot again before its copy ran is the staging hazard: the step that copy belongs
to would read the new contents. The overlapped loop never does it with two slots (it stages
step N+2 only once step N completed, INVARIANTS 26); a loop that stages twice a step
(`engine.split_mixed`) can, so there the host waits for the copy (`wait`), counted in
`waits`. Without `wait` a copy not yet run is counted in `hazards` and the write goes ahead:
the arm that shows the hazard (one slot, the overlapped loop). `pack_into`: a resource's own
copy of what another staged (FlashInfer's plans take the step's host layout so, under their
own fence, where a loop plans twice a step)."""

from __future__ import annotations

import torch


class CopyFences:
    def __init__(self, slots: int, on_cuda: bool) -> None:
        self.on_cuda = on_cuda
        self.events: list[torch.cuda.Event | None] = [None] * slots
        self.wait = False  # wait for a slot's last copy before it is written again
        self.hazards = 0  # writes that went ahead of their slot's last copy
        self.waits = 0  # writes that waited for it

    def before_write(self, slot: int) -> None:
        """Call before writing `slot`'s host memory: waits or counts, as above."""
        event = self.events[slot]
        if event is None or event.query():
            return
        if self.wait:
            event.synchronize()
            self.waits += 1
        else:
            self.hazards += 1

    def copied(self, slot: int) -> None:
        """Call after queueing the copies that read `slot`'s host memory."""
        if self.on_cuda:
            self.events[slot] = torch.cuda.Event()
            self.events[slot].record()


def pack_into(buffer: torch.Tensor, arrays) -> list[torch.Tensor | None]:
    """Each array copied into `buffer` end to end (None stays None); their views there."""
    out, start = [], 0
    for array in arrays:
        if array is None:
            out.append(None)
            continue
        view = buffer[start : start + len(array)]
        view.copy_(array)
        out.append(view)
        start += len(array)
    return out
