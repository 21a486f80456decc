"""What the mock saw: arrivals, concurrent streams over time, its own lateness (`/stats`)."""

from __future__ import annotations

import time
from array import array

import numpy as np

KEEP = 1 << 20  # samples kept per series, so a long-running mock stays bounded in memory


class MockStats:
    """What the mock saw: arrivals, concurrent streams over time, its own lateness.

    Samples live in arrays, which the garbage collector never scans (no pauses); each series
    keeps its last KEEP to 2 * KEEP samples."""

    def __init__(self) -> None:
        self.arrivals = self.active = self.max_active = self.tokens = 0
        self.trace_s, self.trace_active = array("d"), array("i")  # on each change of `active`
        self.due_s, self.lateness_s = array("d"), array("d")  # every token: due, write - due
        # one row per finished request: id; arrival, first and last token written (nan: none)
        self.request_ids: list[str] = []
        self.request_times, self.request_tokens = array("d"), array("i")

    def change(self, delta: int) -> None:
        self.active += delta
        self.max_active = max(self.max_active, self.active)
        self.trace_s.append(time.perf_counter())
        self.trace_active.append(self.active)
        _trim(self.trace_s, self.trace_active)

    def late(self, due: float, seconds: float, tokens: int) -> None:
        self.tokens += tokens
        self.due_s.extend([due] * tokens)
        self.lateness_s.extend([seconds] * tokens)
        _trim(self.due_s, self.lateness_s)

    def finished(
        self, rid: str, arrival: float, first: float | None, last: float | None, n: int
    ) -> None:
        nan = float("nan")
        self.request_ids.append(rid)
        self.request_times.extend(
            (arrival, nan if first is None else first, nan if last is None else last)
        )
        self.request_tokens.append(n)
        if len(self.request_ids) > 2 * KEEP:
            del self.request_ids[:KEEP], self.request_times[: 3 * KEEP], self.request_tokens[:KEEP]

    def summary(self, since: float = float("-inf"), until: float = float("inf")) -> dict:
        """Counts, and the lateness of the tokens due in [since, until] (perf_counter times)."""
        due = np.array(self.due_s)
        late = np.array(self.lateness_s)[(due >= since) & (due <= until)] * 1e3
        p50, p99 = np.percentile(late, [50, 99]).tolist() if late.size else (None, None)
        top = float(late.max()) if late.size else None
        return {
            "arrivals": self.arrivals,
            "active": self.active,
            "max_active": self.max_active,
            "tokens": self.tokens,
            "lateness_ms": {"p50": p50, "p99": p99, "max": top},
        }

    def requests(self) -> list[tuple]:
        """(id, arrival, first token written, last token written, tokens); None where none."""
        t = [None if x != x else x for x in self.request_times]
        return list(
            zip(self.request_ids, t[0::3], t[1::3], t[2::3], self.request_tokens, strict=True)
        )

    def trace(self) -> list[tuple[float, int]]:
        return list(zip(self.trace_s, self.trace_active, strict=True))


def _trim(*series: array) -> None:
    if len(series[0]) > 2 * KEEP:
        for s in series:
            del s[:KEEP]
