"""A server's start-up and stop: `python -m engine serve` launched, to its API answering, its
worker ready and its first token, and from SIGTERM to its exit. Every ABBA block starts four
fresh servers, so the start-up is a floor under every run's wall time and under CI's
end-to-end tests (each starts servers).

    python -m benchmarks.bench_startup
    python -m benchmarks.bench_startup --scenario orpheus --size tiny --starts 5 --json s.jsonl
    python -m benchmarks.bench_startup --template    # workers forked, as the test suite's are
    git worktree add /tmp/before HEAD~3 && python -m benchmarks.bench_startup --tree /tmp/before

Per start, from the launch (time.monotonic, the server's log lines by their wall-clock stamps):
`starting`, the API process's "starting" line (its interpreter, the scenario, the tokenizer,
the port bound, the worker spawned next); `api`, /health's first answer of any status (503
while the worker starts: the API process is ready); `ready`, /health's first 200 (polled every
10 ms; the worker's build and warm-up included); `first token`, the first streamed token of a
one-token request sent at `ready`; `stop`, SIGTERM to the process's exit. The starts run one
after another, each on a fresh port, as `bench run` starts its servers; `--tree` runs another
checkout's engine (before and after a change), as `bench run`'s git arms do; `--template`
forks each worker from a worker template (engine/worker/template.py) that has imported torch,
as the test suite does, where a fresh server's worker is a new interpreter.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from benchmarks import stats
from benchmarks.options import append_json_lines, positive_int
from engine.env import WORKER_TEMPLATE
from engine.worker.template import Template
from harness.errors import BenchError
from harness.measure.server import ServerProcess, die_with_parent

POLL_S = 0.01
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ INFO starting ")


@dataclass(frozen=True)
class Start:
    scenario: str
    size: str
    starting_s: float | None  # the API's "starting" line (None: not found in its log)
    api_s: float  # /health's first answer, of any status
    ready_s: float  # /health's first 200
    first_token_s: float  # the first streamed token of a request sent at ready
    stop_s: float  # SIGTERM to exit
    exit_code: int | None
    template: bool  # the worker forked from a worker template


def starting_line_s(log: Path, launched_wall: float) -> float | None:
    """Seconds from the launch to the log's "starting" line, by its wall-clock stamp (ms)."""
    for line in log.read_text(errors="replace").splitlines():
        if match := _STAMP.match(line):
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp() - launched_wall
    return None


def health_status(url: str) -> int | None:
    """/health's status now; None while nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def first_token(url: str) -> None:
    """Return at the first streamed event of a one-token completion."""
    body = {"prompt": [1, 2, 3], "max_tokens": 1, "stream": True, "ignore_eos": True}
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        for line in resp:
            if line.startswith(b"data: "):
                return
    raise SystemExit("error: the completion streamed no token")


def one_start(
    scenario: str,
    size: str,
    log: Path,
    tree: str | None = None,
    template: str | None = None,
    timeout_s: float = 120.0,
) -> Start:
    """Start one server (`tree`: that checkout's engine; `template`: its worker forked from
    the template on that socket), time it to its API's first answer, /health 200 and its first
    token, and from SIGTERM to its exit."""
    env = {WORKER_TEMPLATE.name: template} if template else None
    server = ServerProcess(scenario, size=size, log_path=log, cwd=tree, env=env)
    launched_wall, launched = time.time(), time.monotonic()
    server.start()
    try:
        while health_status(server.url) is None and server.exited() is None:
            time.sleep(POLL_S)
        api = time.monotonic() - launched
        try:
            server.wait_healthy(timeout_s, poll_s=POLL_S)
        except BenchError as exc:
            raise SystemExit(f"error: {exc}") from None
        ready = time.monotonic() - launched
        first_token(server.url)
        token = time.monotonic() - launched
        stopping = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.wait_exit(timeout=30.0)
        stop = time.monotonic() - stopping
    finally:
        server.stop()
    starting = starting_line_s(log, launched_wall)
    return Start(scenario, size, starting, api, ready, token, stop, code, template is not None)


def render(starts: list[Start]) -> str:
    first = starts[0]
    how = "workers forked from a template" if first.template else "fresh workers"
    lines = [
        f"{first.scenario} {first.size}, {len(starts)} starts ({how}), seconds from the launch:"
    ]
    columns = [
        ("'starting' logged", [s.starting_s for s in starts if s.starting_s is not None]),
        ("API answers /health", [s.api_s for s in starts]),
        ("worker ready (200)", [s.ready_s for s in starts]),
        ("first token", [s.first_token_s for s in starts]),
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
    parser.add_argument(
        "--template",
        action="store_true",
        help="fork each worker from a worker template, as the test suite does",
    )
    parser.add_argument("--json", metavar="PATH", help="append each start as a JSON line")
    args = parser.parse_args(argv)
    if args.tree and not (Path(args.tree) / "engine" / "serve.py").is_file():
        parser.error(f"--tree {args.tree}: no engine/serve.py there")
    template = Template(preexec_fn=die_with_parent()) if args.template else None
    try:
        if template is not None and not template.wait_ready():
            raise SystemExit("error: the worker template did not start")
        socket = template.socket if template else None
        with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
            starts = [
                one_start(args.scenario, args.size, Path(tmp) / f"s{i}.log", args.tree, socket)
                for i in range(args.starts)
            ]
    finally:
        if template is not None:
            template.stop()
    print(render(starts))
    if args.json:
        append_json_lines(args.json, starts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
