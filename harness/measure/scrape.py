"""The server's own counters beside the client's: GET /metrics (Prometheus text, the engine's
or any server's, vLLM's too) once as a slot's steady window opens and once as it closes, kept
as one row per sample (`MetricRecord`, metrics.parquet; docs/RESULTS.md).

The window's edges are seen live on the load's progress tick (every 0.25 s, off the per-token
path), by the load generator's own rules (measure/loadgen.py): closed loop, from all C lanes
busy with the warmup done to the first moment fewer than C are in flight; open loop, from the
first measured request sent with the warmup done to the last request sent (or `send_for_s`).
Each scrape runs in a thread of its own, so the load's event loop never waits on it, and
records when it was taken on the load's clock: the scrapes bracket the steady window to within
a tick (an end the tick never saw is scraped after the load). A server without /metrics, or a
scrape that fails, leaves no rows; nothing else changes.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from typing import Protocol
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from harness.analysis.schema import MetricRecord, Slot

TIMEOUT_S = 5.0
COUNTING = ("counter", "histogram", "summary")  # kinds whose samples only grow: a delta


class Shape(Protocol):
    concurrency: int
    arrivals: object | None


class Scrape:
    """One GET /metrics in its own thread: its text (None when it failed) and its moment."""

    def __init__(self, url: str, headers: dict[str, str] | None):
        self.text: str | None = None
        self.at = 0.0  # perf_counter() midway through the request
        self._thread = threading.Thread(target=self._get, args=(url, headers), daemon=True)
        self._thread.start()

    def _get(self, url: str, headers: dict[str, str] | None) -> None:
        sent = time.perf_counter()
        try:
            request = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
                text = resp.read().decode()
        except (OSError, ValueError):  # no /metrics there, refused, timed out
            return
        self.at, self.text = (sent + time.perf_counter()) / 2, text

    def result(self) -> Scrape:
        self._thread.join(TIMEOUT_S + 1)
        return self


class SteadyScrape:
    """A slot's two scrapes, taken as its load's steady window opens and closes."""

    def __init__(
        self,
        url: str,
        shape: Shape,
        warmup: int,
        total: int,
        send_for_s: float | None = None,
        headers: dict[str, str] | None = None,
    ):
        parts = urlsplit(url)
        self.url = f"{parts.scheme}://{parts.netloc}/metrics"
        self.shape, self.warmup, self.total, self.send_for_s = shape, warmup, total, send_for_s
        self.headers = headers
        self.start: Scrape | None = None
        self.end: Scrape | None = None

    def watching(self, show: Callable) -> Callable:
        """`show` for the runner's progress: it sees each tick of the load first."""

        def seen(status) -> None:
            if status.phase == "load" and status.progress is not None:
                self.observe(status.progress)
            show(status)

        return seen

    def observe(self, progress) -> None:
        """One progress tick (measure/lanes.py Progress)."""
        if self.start is None and self._opened(progress):
            self.start = Scrape(self.url, self.headers)
        elif self.start is not None and self.end is None and self._closed(progress):
            self.end = Scrape(self.url, self.headers)

    def _opened(self, p) -> bool:
        if p.done < self.warmup:
            return False
        if self.shape.arrivals is None:
            return p.in_flight >= self.shape.concurrency
        return p.sent > self.warmup

    def _closed(self, p) -> bool:
        if self.shape.arrivals is None:
            return p.in_flight < self.shape.concurrency
        due = self.send_for_s is not None and p.elapsed_s >= self.send_for_s
        return p.sent >= self.total or due

    def rows(self, slot: Slot, t0_perf: float) -> list[MetricRecord]:
        """The samples of both scrapes (times on the load's clock, from `t0_perf`); none when
        the window never opened or a scrape failed."""
        if self.start is None:
            return []
        self.end = self.end or Scrape(self.url, self.headers)  # the load ended first
        first, last = self.start.result(), self.end.result()
        if first.text is None or last.text is None:
            return []
        before = {key: value for key, value, _ in samples(first.text)}
        start_s, end_s = first.at - t0_perf, last.at - t0_perf
        out = []
        for (name, labels), value, kind in samples(last.text):
            was = before.get((name, labels))
            counting = kind in COUNTING
            if was is None and counting:
                was = 0.0  # a labelled series born inside the window (a first finish reason)
            delta = value - was if counting else None
            out.append(
                MetricRecord(
                    **asdict(slot), name=name, labels=labels, kind=kind, start=was, end=value,
                    delta=delta, start_s=start_s, end_s=end_s,
                )
            )  # fmt: skip
        return out


def samples(text: str) -> list[tuple[tuple[str, str], float, str]]:
    """((sample name, its labels as `k=v,...` sorted), value, its family's kind) per sample;
    `_created` timestamps are left out (not counts)."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out.append(((s.name, labels), float(s.value), family.type))
    return out
