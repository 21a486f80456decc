"""A server's start-up and stop: `python -m engine serve` launched, to /health answering 200,
and from SIGTERM to its exit. Every ABBA block starts four fresh servers, so the start-up is
a floor under every run's wall time and under CI's end-to-end tests (each starts servers).

    python -m benchmarks.bench_startup
    python -m benchmarks.bench_startup --scenario orpheus --size tiny --starts 5 --json s.jsonl
    git worktree add /tmp/before HEAD~3 && python -m benchmarks.bench_startup --tree /tmp/before

Per start, from the launch (time.monotonic, the server's log lines by their wall-clock stamps):
`starting`, the API process's "starting" line (its interpreter, the scenario, the tokenizer,
the port bound, the worker spawned next); `ready`, /health's first 200 (polled every 10 ms;
the worker's build and warm-up included); `stop`, SIGTERM to the process's exit. The starts
run one after another, each on a fresh port, as `bench run` starts its servers; `--tree`
runs another checkout's engine (before and after a change), as `bench run`'s git arms do.
"""

from __future__ import annotations

import argparse
import re
import signal
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from benchmarks import stats
from benchmarks.options import append_json_lines, positive_int
from harness.errors import BenchError
from harness.measure.server import ServerProcess

POLL_S = 0.01
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ INFO starting ")


@dataclass(frozen=True)
class Start:
    scenario: str
    size: str
    starting_s: float | None  # the API's "starting" line (None: not found in its log)
    ready_s: float  # /health's first 200
    stop_s: float  # SIGTERM to exit
    exit_code: int | None


def starting_line_s(log: Path, launched_wall: float) -> float | None:
    """Seconds from the launch to the log's "starting" line, by its wall-clock stamp (ms)."""
    for line in log.read_text(errors="replace").splitlines():
        if match := _STAMP.match(line):
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp() - launched_wall
    return None


def one_start(
    scenario: str, size: str, log: Path, tree: str | None = None, timeout_s: float = 120.0
) -> Start:
    """Start one server (`tree`: that checkout's engine), time it to /health 200 and from
    SIGTERM to its exit."""
    server = ServerProcess(scenario, size=size, log_path=log, cwd=tree)
    launched_wall, launched = time.time(), time.monotonic()
    server.start()
    try:
        try:
            server.wait_healthy(timeout_s, poll_s=POLL_S)
        except BenchError as exc:
            raise SystemExit(f"error: {exc}") from None
        ready = time.monotonic() - launched
        stopping = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.wait_exit(timeout=30.0)
        stop = time.monotonic() - stopping
    finally:
        server.stop()
    return Start(scenario, size, starting_line_s(log, launched_wall), ready, stop, code)


def render(starts: list[Start]) -> str:
    first = starts[0]
    lines = [f"{first.scenario} {first.size}, {len(starts)} starts, seconds from the launch:"]
    columns = [
        ("'starting' logged", [s.starting_s for s in starts if s.starting_s is not None]),
        ("/health 200", [s.ready_s for s in starts]),
        ("stop (SIGTERM to exit)", [s.stop_s for s in starts]),
    ]
    for name, samples in columns:
        summary = stats.summarise(samples)
        lines.append(f"  {name:<24} " + (stats.render(summary, "s") if summary else "no samples"))
    codes = sorted({s.exit_code for s in starts}, key=str)
    lines.append(f"  exit codes after SIGTERM: {codes}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="qwen35")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--starts", type=positive_int, default=5)
    parser.add_argument("--tree", help="a checkout whose engine to start (default: this one)")
    parser.add_argument("--json", metavar="PATH", help="append each start as a JSON line")
    args = parser.parse_args(argv)
    if args.tree and not (Path(args.tree) / "engine" / "serve.py").is_file():
        parser.error(f"--tree {args.tree}: no engine/serve.py there")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        starts = [
            one_start(args.scenario, args.size, Path(tmp) / f"server{i}.log", args.tree)
            for i in range(args.starts)
        ]
    print(render(starts))
    if args.json:
        append_json_lines(args.json, starts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
