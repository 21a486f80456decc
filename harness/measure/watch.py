"""What fails a slot and what fails a run. A slot's load is watched as it runs (`Watch`): a
server that dies or stalls, or a load most of whose requests failed, fails the slot. The
run's measured requests are tallied over the slots whose server neither died nor stalled
(`Tally`): a run most of them failed is no result."""

from __future__ import annotations

from dataclasses import dataclass

from harness.analysis.schema import RequestRecord
from harness.measure.lanes import Progress
from harness.measure.server import ServerProcess, exit_text

# A load in which no request finishes for this long while some are in flight has stalled.
STALL_S = 120.0
# A server whose requests failed and whose /health no longer answers 200 is given this long
# to exit (the engine exits within 2 s of losing its worker) before it counts as alive.
EXIT_WAIT_S = 3.0


@dataclass
class Tally:
    """The measured requests of the run's slots whose server neither died nor stalled, and
    the first failure's error: most of them failed, and the run is no result."""

    requests: int = 0
    failed: int = 0
    first_error: str | None = None

    def add(self, records: list[RequestRecord]) -> None:
        for r in records:
            if not r.warmup:
                self.requests += 1
                self.failed += not r.ok
                if not r.ok and self.first_error is None:
                    self.first_error = what_failed(r)

    @property
    def mostly_failed(self) -> bool:
        return 2 * self.failed > self.requests


class Watch:
    """A slot's load watched on the progress tick (every 0.25 s, off the per-token path): a
    server that exits, or a load in which no request finishes for `stall_s` while some are in
    flight, stops the load at once. Afterwards `fault` says what failed the slot, if anything
    did: a server that died, a stall, or most requests failed."""

    def __init__(self, server: ServerProcess | None, stall_s: float):
        self.server, self.stall_s = server, stall_s
        self.exited: int | None = None  # the server's exit code, once seen
        self.stalled_s: float | None = None  # when the stall began, on the load's clock
        self._done, self._since = -1, 0.0

    @property
    def server_failed(self) -> bool:
        """The server died or stalled (so far as the watch has seen)."""
        return self.exited is not None or self.stalled_s is not None

    def check(self, progress: Progress) -> bool:
        """True when the load must stop."""
        if self.server is not None and self.exited is None:
            self.exited = self.server.exited()
        if progress.done != self._done or progress.in_flight == 0:
            self._done, self._since = progress.done, progress.elapsed_s
        elif progress.elapsed_s - self._since >= self.stall_s and self.stalled_s is None:
            self.stalled_s = self._since
        return self.server_failed

    def fault(self, records: list[RequestRecord]) -> str | None:
        """What failed the slot, from the load's records; None for a slot that did not fail."""
        if self.stalled_s is not None:
            return (
                f"stalled {self.stalled_s:.1f} s into the load: no request finished for"
                f" {self.stall_s:g} s"
            )
        failed = [r for r in records if not r.ok]
        server = self.server
        if server is not None and self.exited is None and failed and not server.answers_health():
            self.exited = server.wait_exit(EXIT_WAIT_S)  # its requests failed: is it dying?
        if self.exited is not None:
            when = f"{min(r.end_s for r in failed):.1f} s into the load" if failed else "under load"
            said = server.last_log_line()
            ends = f"; its log ends: {said}" if said else ""
            return f"died {when} (exit code {exit_text(self.exited)}){ends}"
        measured = [r for r in records if not r.warmup]
        if not measured:
            sent = len(records)
            return (
                f"0 measured requests ({sent} warmup request{'s' if sent != 1 else ''} sent):"
                " the load measured nothing; give more --requests or a longer --duration"
            )
        lost = [r for r in measured if not r.ok]
        if 2 * len(lost) > len(measured):
            first = what_failed(lost[0])
            return f"{len(lost)} of {len(measured)} measured requests failed (the first: {first})"
        return None


def what_failed(record: RequestRecord) -> str:
    return record.error or f"HTTP {record.status}"
