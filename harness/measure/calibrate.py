"""Calibration: the closed loop against a mock whose timing is known (docs/LOADGEN.md).

Starts `bench mock` in a subprocess with a set TTFT and inter-token latency and drives it with
the closed loop. Where this process may use two or more cores and the client runs in one
process, the client is pinned to the first of them and the mock to the others. TTFT measured minus TTFT set splits
exactly into three parts, joined per request on X-Request-Id over the shared monotonic clock
(analysis/calibration.py). A second run with no gap between tokens finds the most tokens per
second the client reads. The result flags itself as doubtful when other processes used the
CPU meanwhile.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from harness.analysis.calibration import TARGETS, latency_errors, load_figures, verdict
from harness.errors import BenchError
from harness.measure.cpu_layout import pinned
from harness.measure.event_loop import run_loop
from harness.measure.loadgen import LoadResult, run_load
from harness.measure.request_sequence import build_requests
from harness.measure.server import free_port
from harness.results import host
from harness.scenario import LoadProfile

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Settings:
    concurrency: int = 256
    output_tokens: int = 256
    itl_ms: float = 5.0
    ttft_ms: float = 20.0
    duration_s: float = 10.0  # steady seconds of each run
    shards: int = 1  # client processes
    mock_shards: int = 1


def calibrate(s: Settings) -> dict:
    latency = run_loop(_latency(s))
    throughput = run_loop(_throughput(s))
    met, doubt = verdict(latency, throughput, one_client_process=s.shards == 1)
    return {
        "settings": asdict(s),
        "targets": TARGETS,
        "met": met,
        "doubtful": doubt,
        "latency": latency,
        "throughput": throughput,
        "machine": client_machine(),
        "command": " ".join(["bench", *sys.argv[1:]]),
        "unix_time": time.time(),
    }


async def _latency(s: Settings) -> dict:
    request_s = (s.ttft_ms + (s.output_tokens - 1) * s.itl_ms) / 1e3
    count = s.concurrency * (2 + math.ceil(s.duration_s / request_s))  # ramp, warmup, steady
    send_for_s = s.duration_s + 3 * request_s  # a client too slow to send them all stops too
    async with MockProcess(s, s.ttft_ms, s.itl_ms) as mock:
        result, out = await _drive(mock, s, count, ramp_s=request_s, send_for_s=send_for_s)
        t0, a, b = result.t0_perf, result.steady_start_s, result.steady_end_s
        stats = await mock.stats(f"requests&since={t0 + a}&until={t0 + b}")
    steady = [r for r in result.records if r.ok and not r.warmup and a <= r.send_s <= b]
    # a sharded mock's /stats covers one of its processes: split only the requests it served
    mock_times = {rid: (arr - t0, first - t0) for rid, arr, first, _, _ in stats["requests"]}
    out["expected_tokens_per_s"] = s.concurrency * s.output_tokens / request_s
    out |= latency_errors(steady, mock_times, s.ttft_ms, s.itl_ms)
    out["mock_lateness_ms"] = stats["lateness_ms"]
    out["mock_max_streams"] = stats["max_active"]
    return out


async def _throughput(s: Settings) -> dict:
    """Flat out: the sequence ends after the steady seconds and a second of ramp, so the run
    is bounded by time whatever the client keeps up with (count is only a ceiling)."""
    async with MockProcess(s, 0.0, 0.0) as mock:
        count = s.concurrency * 1000
        _, out = await _drive(mock, s, count, ramp_s=0.0, send_for_s=s.duration_s + 1.0)
    return out


async def _drive(
    mock: MockProcess, s: Settings, count: int, ramp_s: float, send_for_s: float
) -> tuple[LoadResult, dict]:
    load = LoadProfile(prompt_tokens=(32, 32), output_tokens=(s.output_tokens, s.output_tokens))
    requests = build_requests(load, vocab_size=32000, count=count, seed=0)
    busy, ours, mock_cpu, wall = _machine_busy_s(), _own_cpu_s(), mock.cpu_s(), time.perf_counter()
    with pinned(mock.cores[:1] if mock.pin else None):
        result = await run_load(
            mock.url,
            requests,
            s.concurrency,
            warmup=s.concurrency,
            shards=s.shards,
            ramp_s=ramp_s,
            send_for_s=send_for_s,
        )
    busy, ours = _machine_busy_s() - busy, client_cpu(result, _own_cpu_s() - ours)
    mock_cpu, wall = mock.cpu_s() - mock_cpu, time.perf_counter() - wall
    a, b = result.steady_start_s, result.steady_end_s
    if a is None:
        raise BenchError("the calibration load never reached a steady state; raise --duration")
    others = busy - ours - mock_cpu
    return result, load_figures(result.records, (a, b), result.client_cpu_s, mock_cpu, others, wall)


class MockProcess:
    """`bench mock` in a subprocess on a free loopback port."""

    def __init__(self, s: Settings, ttft_ms: float, itl_ms: float):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cores = tuple(sorted(os.sched_getaffinity(0)))  # the client's first, the mock the rest
        self.pin = s.shards == 1 and len(self.cores) > 1
        self.args = ["mock", "--port", str(self.port), "--ttft-ms", str(ttft_ms)]
        self.args += ["--itl-ms", str(itl_ms), "--output-tokens", str(s.output_tokens)]
        self.args += ["--shards", str(s.mock_shards)]

    async def __aenter__(self) -> MockProcess:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        cmd = [sys.executable, "-c", "from harness.cli import main; main()", *self.args]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=self.log)
        if self.pin:
            os.sched_setaffinity(self.proc.pid, set(self.cores[1:]))
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                try:
                    async with session.get(self.url + "/health") as resp:
                        if resp.status == 200:
                            return self
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
        await self.__aexit__()
        self.log.seek(0)
        raise BenchError(f"the mock did not start: {self.log.read().decode()[-300:]}")

    async def stats(self, query: str = "") -> dict:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{self.url}/stats?{query}") as resp:
                return await resp.json()

    def cpu_s(self) -> float:
        """CPU seconds of the mock and its shard processes so far."""
        total = 0.0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                pid, rest = stat.read_text().split(" (", 1)
            except OSError:
                continue
            fields = rest.rsplit(") ", 1)[1].split()
            if int(pid) == self.proc.pid or int(fields[1]) == self.proc.pid:
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    async def __aexit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=15)


def _own_cpu_s() -> float:
    """CPU seconds of this process alone. Not its reaped children's (`os.times().children_*`):
    inside a test suite those include servers of earlier tests reaped during the window, whose
    whole lifetime's CPU would be taken off the machine's and make a busy machine read quiet
    (a timing test flaked that way). The client's shards count through `client_cpu`."""
    return time.process_time()


def client_cpu(result: LoadResult, own_s: float) -> float:
    """The client's CPU seconds during a load: this process's (`own_s`, a `_own_cpu_s`
    difference) and, for a sharded load, its shard processes' as the result reports them (an
    in-process load's figure is this process's own, already in `own_s`)."""
    return own_s + (result.client_cpu_s if result.shards > 1 else 0.0)


def _machine_busy_s() -> float:
    """CPU seconds the cores this process may use have run anything, from /proc/stat's per-core
    lines (user nice system irq softirq steal): the whole machine's unless this process is
    pinned (a core that a test runner gives each of its workers: what shares ours is what
    disturbs our timing)."""
    mine = {f"cpu{core}" for core in os.sched_getaffinity(0)}
    busy = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name in mine:
            fields = [int(x) for x in values[:8]]
            busy += sum(fields[:3]) + sum(fields[5:8])
    return busy / os.sysconf("SC_CLK_TCK")


def client_machine() -> dict:
    """The host and the client's libraries and load: what calibration figures depend on."""
    import uvloop

    versions = {"aiohttp": aiohttp.__version__, "uvloop": uvloop.__version__}
    return {**host(), **versions, "loadavg": os.getloadavg()}
