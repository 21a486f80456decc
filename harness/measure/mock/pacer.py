"""The mock's token pacer: one timer writes every reply's tokens when they are due.

It keeps a heap of (due time, reply) and on each wake writes every token that is due, so a
token costs one heap operation and one socket write, not one sleep per token per reply.
Token k of a reply is due at arrival + ttft + k * itl, anchored to the arrival so lateness
never accumulates; the pacer notes its own lateness (write time minus due time) in the
mock's stats.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time

from harness.measure.mock.stats import MockStats

# Event-loop timers have millisecond resolution (uvloop rounds to the nearest ms), so a wake
# writes every token due within the next half millisecond instead of re-arming for it.
EARLY_S = 0.0005
BATCH = 32  # tokens written per turn of the event loop, so a burst does not hold up arrivals
VOCAB = 32000
TOKEN = b'data: %s"text":" t%d","token_ids":[%d],"logprobs":null,"finish_reason":null}]}\n\n'


class PacedReply:
    """One streamed reply in the pacer's heap: its next token's due time and how many are left;
    `done` resolves to the last write's time (None when the client went away)."""

    __slots__ = ("transport", "head", "due", "left", "sent", "first", "done")

    def __init__(self, transport: asyncio.Transport, head: bytes, due: float, tokens: int):
        self.transport, self.head, self.due, self.left = transport, head, due, tokens
        self.sent = 0
        self.first: float | None = None
        self.done = asyncio.get_running_loop().create_future()  # the last write time, or None


class TokenPacer:
    """Writes every reply's tokens on schedule from one timer. Token frames go straight to the
    transport as HTTP chunks (the response was prepared chunked), so writing never waits."""

    def __init__(self, itl_s: float, stats: MockStats):
        self.itl_s, self.stats = itl_s, stats
        self.heap: list[tuple[float, int, PacedReply]] = []
        self.seq = itertools.count()
        self.timer: asyncio.Handle | None = None
        self.wake = float("inf")

    def add(self, reply: PacedReply) -> None:
        heapq.heappush(self.heap, (reply.due, next(self.seq), reply))
        if reply.due < self.wake:
            self._arm(reply.due)

    def _arm(self, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.wake = when
        self.timer = asyncio.get_running_loop().call_later(when - time.perf_counter(), self._fire)

    def _fire(self) -> None:
        self.timer, self.wake = None, float("inf")
        heap, written = self.heap, 0
        while heap and heap[0][0] <= time.perf_counter() + EARLY_S:
            if written >= BATCH:  # let arrivals in before writing the rest
                self.wake = heap[0][0]
                self.timer = asyncio.get_running_loop().call_soon(self._fire)
                return
            due, _, s = heapq.heappop(heap)
            if s.transport.is_closing():  # the client went away
                if not s.done.done():
                    s.done.set_result(None)
                continue
            burst = s.left if self.itl_s == 0 else 1  # no gap between tokens: all at once
            s.transport.writelines([_token_frame(s.head, s.sent + k) for k in range(burst)])
            now = time.perf_counter()
            self.stats.late(due, now - due, burst)
            written += burst
            s.first = s.first or now
            s.sent += burst
            s.left -= burst
            if s.left > 0:
                s.due = due + self.itl_s
                heapq.heappush(heap, (s.due, next(self.seq), s))
            elif not s.done.done():
                s.done.set_result(now)
        if heap:
            self._arm(heap[0][0])


def token_id(k: int) -> int:
    """The k-th token of every reply."""
    return (k * 7919 + 17) % VOCAB


def _token_frame(head: bytes, k: int) -> bytes:
    """The k-th token's SSE event as one HTTP chunk."""
    token = token_id(k)
    data = TOKEN % (head, token, token)
    return b"%x\r\n%s\r\n" % (len(data), data)
