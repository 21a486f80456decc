"""The API server's Prometheus metrics: GET /metrics (docs/API.md lists them, and which carry
vLLM's meaning under vLLM's name with our `engine:` prefix).

The tallies are plain numbers kept by the API process as frames pass through it: a request's
arrival, each of its frames as the worker's message is read (`RequestTally.frame`, called by
WorkerClient's reader, not by the reply's handler, which under load may drain several frames
at once: a clock read, a bucket found by bisection and a few adds, no lock: the event loop is
one thread), its end, and each message of frames from the worker (one per worker step that
sent any). prometheus_client renders them only when /metrics is read, with the worker's pool
(running, waiting, pages and slots) asked for then; nothing is pushed to the worker and
nothing runs per token but those adds (benchmarks/bench_metrics.py measures a frame's cost
against a prometheus_client counter's `inc`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from time import perf_counter

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from engine.messages import WorkerStats

PREFIX = "engine:"
CONTENT_TYPE = CONTENT_TYPE_LATEST
# Upper bounds in seconds. Finer at the low end than vLLM's (its inter-token buckets start at
# 10 ms; a decode step here takes a few ms on a GPU).
TTFT_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    2.5,
    5,
    10,
    20,
    40,
    80,
)
ITL_S = (
    0.0005,
    0.001,
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.2,
    0.5,
    1,
    2.5,
)
E2E_S = (0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 60, 120, 240, 480, 960)
STEP_S = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1)  # fmt: skip


class Histogram:
    """Counts per bucket and a sum, rendered cumulative (Prometheus's `le` buckets)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # value <= bound: that bucket
        self.sum += value

    def family(self, name: str, help_text: str, model: str) -> HistogramMetricFamily:
        family = HistogramMetricFamily(PREFIX + name, help_text, labels=["model_name"])
        total, buckets = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
        family.add_metric([model], buckets, self.sum)
        return family


class EngineMetrics:
    """The API process's tallies, and /metrics rendered from them."""

    def __init__(self, model: str):
        self.model = model
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: Counter[str] = Counter()  # finish reason -> requests
        self.ttft = Histogram(TTFT_S)
        self.itl = Histogram(ITL_S)
        self.e2e = Histogram(E2E_S)
        self.tpot = Histogram(ITL_S)
        self.step_interval = Histogram(STEP_S)
        self._last_step: float | None = None
        self._busy = False

    def request(self, prompt_tokens: int, arrival: float) -> RequestTally:
        """A request accepted (validated and tokenized) that arrived at `arrival`
        (perf_counter(), as its handler began, before its body was read)."""
        return RequestTally(self, prompt_tokens, arrival)

    def step(self, open_streams: int) -> None:
        """A message of frames from the worker (one worker step) has been routed, leaving
        `open_streams` requests open. The interval since the previous one is a step's time
        while requests were open throughout (an idle worker's gap is no step)."""
        now = perf_counter()
        if self._busy:
            self.step_interval.observe(now - self._last_step)
        self._last_step, self._busy = now, open_streams > 0

    def render(self, pool: WorkerStats | None, in_flight: int) -> bytes:
        """The Prometheus text format; the worker's gauges only when `pool` came."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(self._families(pool, in_flight)))
        return generate_latest(registry)

    def _families(self, pool: WorkerStats | None, in_flight: int) -> list:
        m = self.model
        families = [
            _counter("prompt_tokens", "Prompt tokens of requests whose prefill ended.", m, self.prompt_tokens),
            _counter("generation_tokens", "Tokens generated (sent to clients).", m, self.generation_tokens),
            self.ttft.family("time_to_first_token_seconds", "Time from a request's arrival to its first token.", m),
            self.itl.family("inter_token_latency_seconds", "Time between a request's consecutive frames of tokens.", m),
            self.e2e.family("e2e_request_latency_seconds", "Time from a request's arrival to its last frame.", m),
            self.tpot.family("request_time_per_output_token_seconds", "Per request: (last - first token) / (tokens - 1).", m),
            self.step_interval.family("step_interval_seconds", "Time between worker steps that sent frames, requests open throughout.", m),
            _gauge("api_requests_in_flight", "Requests open at the API server.", m, in_flight),
        ]  # fmt: skip
        success = CounterMetricFamily(
            PREFIX + "request_success", "Finished requests by finish reason.",
            labels=["model_name", "finished_reason"],
        )  # fmt: skip
        for reason, count in sorted(self.finished.items()):
            success.add_metric([m, reason], count)
        families.append(success)
        if pool is not None:
            used_pages = pool.total_pages - pool.free_pages
            families += [
                _gauge("num_requests_running", "Requests admitted by the scheduler.", m, pool.running),
                _gauge("num_requests_waiting", "Requests waiting for admission.", m, pool.waiting),
                _gauge("kv_cache_usage_perc", "Fraction of KV pages in use (0-1).", m, used_pages / max(pool.total_pages, 1)),
                _gauge("kv_pages_used", "KV pages in use.", m, used_pages),
                _gauge("kv_pages_total", "KV pages in the pool.", m, pool.total_pages),
                _gauge("state_slots_used", "Linear-attention state slots in use.", m, pool.total_slots - pool.free_slots),
                _gauge("state_slots_total", "Linear-attention state slots in the pool.", m, pool.total_slots),
                _gauge("num_requests_streaming", "Requests a downstream node (the codec) still holds.", m, pool.streaming),
            ]  # fmt: skip
        return families


class RequestTally:
    """One request's clock: its arrival, its first and last frames."""

    __slots__ = ("metrics", "prompt_tokens", "arrival", "first", "last", "tokens", "ended")

    def __init__(self, metrics: EngineMetrics, prompt_tokens: int, arrival: float):
        self.metrics, self.prompt_tokens, self.arrival = metrics, prompt_tokens, arrival
        self.first = self.last = 0.0
        self.tokens = 0
        self.ended = False

    def frame(self, tokens: int) -> None:
        """A frame of `tokens` new tokens (the per-token path: keep it this small)."""
        now = perf_counter()
        metrics = self.metrics
        if self.tokens:
            metrics.itl.observe(now - self.last)
        else:
            self.first = now
            metrics.ttft.observe(now - self.arrival)
            metrics.prompt_tokens += self.prompt_tokens
        self.last = now
        self.tokens += tokens
        metrics.generation_tokens += tokens

    def finish(self, reason: str) -> None:
        """The request ended (`length`, `stop`, `abort`, `error`); counted once."""
        if self.ended:
            return
        self.ended = True
        metrics = self.metrics
        metrics.finished[reason] += 1
        if self.tokens:
            metrics.e2e.observe(self.last - self.arrival)
        if self.tokens > 1:
            metrics.tpot.observe((self.last - self.first) / (self.tokens - 1))


class _Families:
    """A collector of families made for one scrape."""

    def __init__(self, families: list):
        self._families = families

    def collect(self):
        return iter(self._families)


def _counter(name: str, help_text: str, model: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(PREFIX + name, help_text, labels=["model_name"])
    family.add_metric([model], value)
    return family


def _gauge(name: str, help_text: str, model: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(PREFIX + name, help_text, labels=["model_name"])
    family.add_metric([model], value)
    return family
