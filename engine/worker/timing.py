"""Phase timing: spans and counts gathered per window of `period` worker iterations.

Off unless BENCH_PHASE_TIMING holds a period; when off the worker's hot path checks one
boolean per site and does nothing else (benchmarks/bench_runtime.py measures the cost).
Every `period` iterations the window's raw samples go out as one `SpanWindow` and nothing is
computed from them here: the harness computes each name's n, sum, percentiles and max
(engine/spans.py, `window_records`). Packing and sending a window is the worker's one piece
of bookkeeping between iterations; it is timed as its own span, `worker.timing.flush`, in the
window that follows (docs/SPANS.md).
"""

from __future__ import annotations

import time
from collections import defaultdict

import zmq

from engine.spans import (
    END_TOPIC,
    SPAN_FLUSH,
    WINDOW_TOPIC,
    SpanStreamEnd,
    SpanWindow,
    encode,
    encode_window,
    samples,
    window_records,
)

now_ns = time.perf_counter_ns


class PhaseTimer:
    def __init__(self, period: int, server: str, sinks: list):
        self.enabled = period > 0
        self.period = period
        self.server = server
        self.sinks = sinks  # each called with every SpanWindow
        self.iteration = 0
        self._first_iter = 1
        self._rows = 0
        self._start_unix = time.time()
        self._spans: dict[str, list[int]] = defaultdict(list)
        self._counts: dict[str, list[int]] = defaultdict(list)

    def span(self, name: str, ns: int) -> None:
        self._spans[name].append(ns)

    def count(self, name: str, value: int) -> None:
        self._counts[name].append(value)

    def end_iteration(self, rows: int) -> None:
        self.iteration += 1
        self._rows += rows
        if self.iteration - self._first_iter + 1 >= self.period:
            self.flush()

    def window(self) -> SpanWindow:
        """The window so far, raw."""
        return SpanWindow(
            self.server,
            self._first_iter,
            self.iteration,
            self._rows,
            self._start_unix,
            time.time(),
            {name: samples(values) for name, values in self._spans.items()},
            {name: samples(values) for name, values in self._counts.items()},
        )

    def flush(self) -> None:
        """Send the window (if it covers an iteration) and start the next; the time this
        takes is the first sample of the next window's SPAN_FLUSH."""
        start = now_ns()
        if self.iteration >= self._first_iter:
            window = self.window()
            for sink in self.sinks:
                sink(window)
        self._spans.clear()
        self._counts.clear()
        self._rows = 0
        self._first_iter = self.iteration + 1
        self._start_unix = time.time()
        self.span(SPAN_FLUSH, now_ns() - start)


def jsonl_sink(path: str):
    """Appends each window's records to a JSONL file, one record per line. It computes the
    records in the worker, on its critical path: a debugging aid, not a measurement."""
    handle = open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the worker

    def write(window: SpanWindow) -> None:
        handle.write(b"".join(encode(r) + b"\n" for r in window_records(window)))

    return write


class SpanPublisher:
    """PUBlishes each window to the harness's span collector; `end` says no window follows,
    so the harness takes a server's windows as soon as it has them all."""

    def __init__(self, ctx: zmq.Context, address: str, server: str):
        self.server = server
        self.socket = ctx.socket(zmq.PUB)
        self.socket.setsockopt(zmq.LINGER, 2000)  # the last window still goes out at shutdown
        self.socket.connect(address)

    def publish(self, window: SpanWindow) -> None:
        self.socket.send_multipart([WINDOW_TOPIC, encode_window(window)], copy=False)

    def end(self) -> None:
        self.socket.send_multipart([END_TOPIC, encode(SpanStreamEnd(self.server))])
