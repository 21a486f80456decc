"""Does a Prometheus scrape loop move the engine's throughput? An A/A of one build: arm A's
servers run the load alone, arm B's with GET /metrics every `--interval-s` seconds beside it
(what a Prometheus server or a load tool's metrics collector does), in A B B A / B A A B
blocks of fresh servers, judged as `bench run` judges (harness.analysis.stats.paired_change
over the servers' steady output tok/s).

    python -m benchmarks.bench_scrape_cost --size 0.8b -c 64 --blocks 4          # the GPU machine
    python -m benchmarks.bench_scrape_cost --size tiny -c 8 --blocks 2 --requests 96 --warmup 16

Prints one JSON object: each server's tok/s and scrapes, the change B/A - 1 with its interval
and verdict. Each scrape asks the worker for its pool (one GetStats message, `worker.msg.*`)
and renders the API process's tallies (benchmarks/bench_metrics.py: ~0.6 ms on this CPU).
"""

from __future__ import annotations

import argparse
import json
import threading
import urllib.request
from dataclasses import asdict

import pandas as pd

from engine.models import vocab_size
from harness.analysis import metrics
from harness.analysis.block_model import schedule
from harness.analysis.schema import ServerRecord, Slot
from harness.analysis.stats import paired_change
from harness.measure.event_loop import run_loop
from harness.measure.loadgen import run_load
from harness.measure.request_sequence import build_requests
from harness.measure.server import ServerProcess
from harness.scenario import load_scenario


class ScrapeLoop:
    """GET /metrics every `interval_s` in a thread until stopped; counts the 200s."""

    def __init__(self, url: str, interval_s: float):
        self.url, self.interval_s = f"{url}/metrics", interval_s
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> ScrapeLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with urllib.request.urlopen(self.url, timeout=10) as resp:
                resp.read()
                self.scrapes += resp.status == 200


def one_server(args, letter: str, number: int, requests) -> dict:
    slot = Slot("scrape" if letter == "B" else "alone", letter, f"{letter}{number}", 0, number)
    with ServerProcess("qwen35", size=args.size, overrides=args.set) as server:
        interval = args.interval_s if letter == "B" else None
        loop = ScrapeLoop(server.url, interval) if interval else None
        coro = run_load(server.url, requests, args.concurrency, args.warmup, slot)
        if loop is None:
            result = run_loop(coro)
        else:
            with loop:
                result = run_loop(coro)
    rows = pd.DataFrame([asdict(r) for r in result.records])
    record = ServerRecord(**asdict(slot), port=0, log="", t0_unix=0.0, start_unix=0.0)
    record.steady_start_s, record.steady_end_s = result.steady_start_s, result.steady_end_s
    window = metrics.steady_window(record)
    value = metrics.steady_tok_per_s(rows, window) if window else float("nan")
    return {"server": slot.server, "letter": letter, "value": value,
            "scrapes": loop.scrapes if loop else 0}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--set", default=None, help="scenario overrides, key=value,...")
    parser.add_argument("-c", "--concurrency", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--requests", type=int, default=None, help="default: the scenario's")
    parser.add_argument("--warmup", type=int, default=None, help="default: the scenario's")
    parser.add_argument("--interval-s", type=float, default=1.0)
    args = parser.parse_args()
    scenario = load_scenario("qwen35", size=args.size)
    load = scenario.load
    args.warmup = load.warmup if args.warmup is None else args.warmup
    count = args.warmup + (load.requests if args.requests is None else args.requests)
    requests = build_requests(load, vocab_size(scenario.model), count)
    letters = schedule(args.blocks, abba=True)
    servers = []
    for number, letter in enumerate(letters):
        servers.append(one_server(args, letter, number, requests) | {"block": number // 4})
    values = pd.DataFrame(servers)
    change = paired_change(values, "A", "B", higher_is_better=True)
    print(json.dumps({"servers": servers, "change": asdict(change)}, default=str))


if __name__ == "__main__":
    main()
