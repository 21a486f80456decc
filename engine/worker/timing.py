"""Phase timing: spans and counts gathered per window of `period` worker iterations.

Off unless BENCH_PHASE_TIMING holds a period; when off the worker's hot path checks one
boolean per site and does nothing else (benchmarks/bench_runtime.py measures the cost).
Every `period` iterations one record per span name is emitted (docs/SPANS.md); the record
and the names are the span wire, engine/spans.py.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import zmq

from engine.spans import (
    COUNT,
    END_TOPIC,
    RECORDS_TOPIC,
    SPAN,
    SpanStreamEnd,
    SpanWindowRecord,
    encode,
)

now_ns = time.perf_counter_ns


class PhaseTimer:
    def __init__(self, period: int, server: str, sinks: list):
        self.enabled = period > 0
        self.period = period
        self.server = server
        self.sinks = sinks
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

    def records(self) -> list[SpanWindowRecord]:
        iterations = self.iteration - self._first_iter + 1
        mean_batch = self._rows / iterations if iterations else 0.0
        end_unix = time.time()
        out = []
        for kind, table in ((SPAN, self._spans), (COUNT, self._counts)):
            for name, values in sorted(table.items()):
                arr = np.asarray(values, dtype=np.float64)
                p50, p95 = np.percentile(arr, [50, 95])
                out.append(
                    SpanWindowRecord(
                        self.server,
                        name,
                        kind,
                        self._first_iter,
                        self.iteration,
                        iterations,
                        mean_batch,
                        len(arr),
                        float(arr.sum()),
                        float(p50),
                        float(p95),
                        float(arr.max()),
                        self._start_unix,
                        end_unix,
                    )
                )
        return out

    def flush(self) -> None:
        if self.iteration >= self._first_iter:
            records = self.records()
            for sink in self.sinks:
                sink(records)
        self._spans.clear()
        self._counts.clear()
        self._rows = 0
        self._first_iter = self.iteration + 1
        self._start_unix = time.time()


def jsonl_sink(path: str):
    handle = open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the worker

    def write(records: list[SpanWindowRecord]) -> None:
        handle.write(b"".join(encode(r) + b"\n" for r in records))

    return write


class SpanPublisher:
    """PUBlishes each window to the harness's span collector; `end` says no window follows,
    so the harness takes a server's windows as soon as it has them all."""

    def __init__(self, ctx: zmq.Context, address: str, server: str):
        self.server = server
        self.socket = ctx.socket(zmq.PUB)
        self.socket.setsockopt(zmq.LINGER, 2000)  # the last window still goes out at shutdown
        self.socket.connect(address)

    def publish(self, records: list[SpanWindowRecord]) -> None:
        self.socket.send_multipart([RECORDS_TOPIC, encode(records)])

    def end(self) -> None:
        self.socket.send_multipart([END_TOPIC, encode(SpanStreamEnd(self.server))])
