"""A client host's clock against the driver's, NTP-style (docs/SCALE.md, "Clock offsets").

The driver notes its wall time t_send, asks the remote for its wall time t_remote, and notes
t_recv when the answer is back. If the remote read its clock halfway through the round trip,
offset = t_remote - (t_send + t_recv) / 2; wherever it read it, the error is at most half the
round trip, so of several samples the one with the shortest round trip is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

SAMPLES = 16


@dataclass(frozen=True)
class Offset:
    offset_s: float  # remote clock - driver clock
    rtt_s: float  # the kept sample's round trip: |error| <= rtt_s / 2

    def manifest(self) -> dict:
        return {"offset_s": self.offset_s, "rtt_s": self.rtt_s, "error_bound_s": self.rtt_s / 2}


def estimate(samples: list[tuple[float, float, float]]) -> Offset:
    """The offset from (t_send, t_remote, t_recv) samples: the shortest round trip's."""
    if not samples:
        raise ValueError("no clock samples")
    t_send, t_remote, t_recv = min(samples, key=lambda s: s[2] - s[0])
    return Offset(t_remote - (t_send + t_recv) / 2, t_recv - t_send)


def measure(ask: Callable[[], float], now: Callable[[], float], count: int = SAMPLES) -> Offset:
    """`count` samples of `ask()` (the remote's wall time) between readings of `now()`."""
    samples = []
    for _ in range(count):
        t_send = now()
        t_remote = ask()
        samples.append((t_send, t_remote, now()))
    return estimate(samples)
