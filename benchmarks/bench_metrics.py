"""What /metrics costs the API server on its per-token path: the tally of one frame
(engine/api/metrics.py `RequestTally.frame`, the only work a token adds) against the
operations it stands in for, a prometheus_client Counter's `inc` and Histogram's `observe`,
and what one scrape's rendering costs (off the per-token path, once per GET /metrics).

    python -m benchmarks.bench_metrics [--calls 200000] [--repeats 7] [--json FILE]

Each figure is the best of `--repeats` timings of `--calls` calls, in ns per call (the best:
the machine's noise only ever adds).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client import Histogram as PromHistogram

from engine.api.metrics import ITL_S, EngineMetrics
from engine.messages import WorkerStats


def best_ns(call: Callable[[], None], calls: int, repeats: int) -> float:
    """ns per call, the best of `repeats` loops of `calls` calls."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter_ns() - start) / calls)
    return best


def run(calls: int, repeats: int) -> dict:
    metrics = EngineMetrics("m")
    tally = metrics.request(prompt_tokens=16, arrival=time.perf_counter())
    tally.frame(1)  # past the first frame: each further frame observes an inter-token gap
    registry = CollectorRegistry()
    counter = PromCounter("c", "c", registry=registry)
    histogram = PromHistogram("h", "h", buckets=ITL_S, registry=registry)
    empty = best_ns(lambda: None, calls, repeats)  # the loop and a call, taken off each figure
    figures = {
        "frame_ns": best_ns(lambda: tally.frame(1), calls, repeats) - empty,
        "prometheus_counter_inc_ns": best_ns(counter.inc, calls, repeats) - empty,
        "prometheus_histogram_observe_ns": best_ns(lambda: histogram.observe(0.004), calls, repeats)
        - empty,
    }
    pool = WorkerStats(
        free_pages=100, total_pages=512, free_slots=2, total_slots=16, running=14, waiting=3
    )
    renders = max(1, calls // 1000)
    figures["render_us"] = best_ns(lambda: metrics.render(pool, 17), renders, repeats) / 1e3
    figures["frame_vs_counter_inc"] = figures["frame_ns"] / figures["prometheus_counter_inc_ns"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    figures = run(args.calls, args.repeats)
    for name, value in figures.items():
        print(f"{name:34} {value:10.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
