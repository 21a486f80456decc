"""The worker's word that its loop is alive, for the API server's stall watchdog
(engine/api/worker_client.py, docs/RELIABILITY.md fault 15).

From Ready on the loop calls `Pulse.idle` on each empty poll and `Pulse.stepped` after each
busy pass; either sends a Heartbeat when HEARTBEAT_S has passed since the last, with the
longest busy pass so far. Sent from the loop itself, not a thread: a loop stuck in a step
(a device that hangs, a lock) must fall silent, which a thread beside it would not.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from engine.messages import Heartbeat

HEARTBEAT_S = 0.5


class Pulse:
    def __init__(self, send: Callable[[msgspec.Struct], None]):
        self.send = send
        self.longest_step_s = 0.0
        self._last = time.monotonic()

    def idle(self) -> None:
        self._beat(time.monotonic())

    def stepped(self, started: float) -> None:
        """A busy pass that began at `started` (time.monotonic) has ended."""
        now = time.monotonic()
        self.longest_step_s = max(self.longest_step_s, now - started)
        self._beat(now)

    def _beat(self, now: float) -> None:
        if now - self._last >= HEARTBEAT_S:
            self._last = now
            self.send(Heartbeat(self.longest_step_s))
