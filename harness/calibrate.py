"""Calibration: how closely the load generator measures a server whose timing is known.

Starts `bench mock` (a subprocess, pinned to its own cores where the machine has two or more)
with a set TTFT and inter-token latency, drives it with the closed loop (pinned to core 0), and
compares what the client measured with what the mock was set to do and with what the mock says
it did (its write times, joined per request on X-Request-Id). A second run, with no gap between
tokens, finds the most tokens per second the client can read.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import numpy as np

from engine.config import LoadProfile
from harness.errors import BenchError
from harness.loadgen import LoadResult, build_requests, run_closed_loop, run_loop

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"ttft_error_p50_ms": 1.0, "ttft_error_p99_ms": 5.0, "tokens_per_s": 50_000}


@dataclass(frozen=True)
class Settings:
    concurrency: int = 256
    output_tokens: int = 256
    itl_ms: float = 5.0
    ttft_ms: float = 20.0
    duration_s: float = 10.0  # steady part of each run
    shards: int = 1  # client processes
    mock_shards: int = 1


def calibrate(s: Settings) -> dict:
    latency = run_loop(_latency(s))
    throughput = run_loop(_throughput(s))
    one_core = s.shards == 1
    met = {
        "ttft_error_p50": latency["ttft_error_ms"]["p50"] <= TARGETS["ttft_error_p50_ms"],
        "ttft_error_p99": latency["ttft_error_ms"]["p99"] <= TARGETS["ttft_error_p99_ms"],
        "tokens_per_s_one_core": one_core and throughput["tokens_per_s"] >= TARGETS["tokens_per_s"],
        "no_failures": latency["failures"] == 0 and throughput["failures"] == 0,
    }
    return {
        "settings": asdict(s),
        "targets": TARGETS,
        "met": met,
        "latency": latency,
        "throughput": throughput,
        "machine": _machine(),
        "command": " ".join(["bench", *sys.argv[1:]]),
        "unix_time": time.time(),
    }


async def _latency(s: Settings) -> dict:
    request_s = (s.ttft_ms + (s.output_tokens - 1) * s.itl_ms) / 1e3
    count = s.concurrency + int(np.ceil(s.duration_s / request_s * s.concurrency))
    async with Mock(s, s.ttft_ms, s.itl_ms) as mock:
        result = await _drive(mock.url, s, count, stop_after_s=None)
        stats = await mock.stats()
    steady = _steady(result)
    ttft = np.array([r.first_token_s - r.send_s for r in steady]) * 1e3
    # what the mock did, per request (a sharded mock's /stats covers one of its processes)
    by_id = {rid: (first - arrival) * 1e3 for rid, arrival, first, _, _ in stats["requests"]}
    joined = [(t, by_id[str(r.index)]) for t, r in zip(ttft, steady) if str(r.index) in by_id]
    overhead = np.array([t - m for t, m in joined])
    itl = np.concatenate([np.diff(r.token_times_s) for r in steady]) * 1e3
    out = _throughput_figures(result, s)
    out["expected_tokens_per_s"] = s.concurrency * s.output_tokens / request_s
    out["ttft_error_ms"] = _pct(ttft - s.ttft_ms)
    out["ttft_client_overhead_ms"] = _pct(overhead)  # measured - what the mock did
    out["itl_error_ms"] = _pct(itl - s.itl_ms)
    out["send_lag_ms"] = _pct(np.array([r.send_s - r.intended_send_s for r in steady]) * 1e3)
    out["mock_lateness_ms"] = stats["lateness_ms"]
    out["mock_max_streams"] = stats["max_active"]
    return out


async def _throughput(s: Settings) -> dict:
    async with Mock(s, 0.0, 0.0) as mock:
        count = s.concurrency * (1 + 64)
        result = await _drive(mock.url, s, count, stop_after_s=s.duration_s + 1.0)
        cpu = mock.cpu_s()
    out = _throughput_figures(result, s)
    out["mock_cpu_s"] = cpu
    return out


async def _drive(url: str, s: Settings, count: int, stop_after_s: float | None) -> LoadResult:
    load = LoadProfile(prompt_tokens=(32, 32), output_tokens=(s.output_tokens, s.output_tokens))
    requests = build_requests(load, vocab_size=32000, count=count, seed=0)
    stop = asyncio.Event()
    if stop_after_s is not None:
        asyncio.get_running_loop().call_later(stop_after_s, stop.set)
    with _pinned({0} if s.shards == 1 else None):
        return await run_closed_loop(url, requests, s.concurrency, warmup=s.concurrency,
                                     stop_event=stop, shards=s.shards)  # fmt: skip


def _steady(result: LoadResult) -> list:
    """Measured requests sent inside the steady window, that succeeded."""
    a, b = result.steady_start_s, result.steady_end_s
    if a is None:
        raise BenchError("the calibration run never reached a steady state; raise --duration")
    return [r for r in result.records if r.ok and not r.warmup and a <= r.send_s <= b]


def _throughput_figures(result: LoadResult, s: Settings) -> dict:
    a, b = result.steady_start_s, result.steady_end_s
    times = np.concatenate([r.token_times_s for r in result.records if r.token_times_s] or [[]])
    tokens = int(times.size)
    elapsed = max(r.end_s for r in result.records)
    failures = [r for r in result.records if not r.ok and r.error != "interrupted"]
    return {
        "requests": len(result.records),
        "failures": len(failures),
        "first_failure": failures[0].error if failures else None,
        "steady_s": b - a,
        "tokens_per_s": float(((times >= a) & (times <= b)).sum() / (b - a)),
        "client_cpu_s": result.client_cpu_s,
        "client_cores": result.client_cpu_s / elapsed,
        "client_cpu_us_per_token": result.client_cpu_s / max(tokens, 1) * 1e6,
    }


def _pct(values: np.ndarray) -> dict:
    if values.size == 0:
        raise BenchError("no steady-state requests to calibrate on; raise --duration")
    p50, p99 = np.percentile(values, [50, 99])
    return {
        "p50": float(p50),
        "p99": float(p99),
        "mean": float(values.mean()),
        "n": int(values.size),
    }


class Mock:
    """`bench mock` in a subprocess on a free loopback port."""

    def __init__(self, s: Settings, ttft_ms: float, itl_ms: float):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.pin = s.shards == 1 and (os.cpu_count() or 1) > 1  # the client takes core 0
        self.args = ["mock", "--port", str(self.port), "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
                     "--output-tokens", str(s.output_tokens), "--shards", str(s.mock_shards)]  # fmt: skip

    async def __aenter__(self) -> Mock:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        cmd = [sys.executable, "-c", "from harness.cli import main; main()", *self.args]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=self.log)
        if self.pin:
            os.sched_setaffinity(self.proc.pid, set(range(1, os.cpu_count() or 1)))
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.get(self.url + "/health") as resp:
                        if resp.status == 200:
                            return self
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
        await self.__aexit__()
        self.log.seek(0)
        raise BenchError(f"the mock did not start: {self.log.read().decode()[-300:]}")

    async def stats(self) -> dict:
        async with aiohttp.ClientSession() as session:
            async with session.get(self.url + "/stats?requests") as resp:
                return await resp.json()

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def __aexit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


class _pinned:
    """Pin this process to `cores` for the block (where the machine has more than one core)."""

    def __init__(self, cores: set[int] | None):
        self.cores = cores if (os.cpu_count() or 1) > 1 else None

    def __enter__(self) -> None:
        if self.cores:
            self.saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.cores)

    def __exit__(self, *exc) -> None:
        if self.cores:
            os.sched_setaffinity(0, self.saved)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _machine() -> dict:
    import aiohttp as aio

    try:
        import uvloop

        uv = uvloop.__version__
    except ImportError:
        uv = None
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor(),
            "python": platform.python_version(), "aiohttp": aio.__version__, "uvloop": uv}  # fmt: skip


def write(result: dict, directory: Path = ROOT / "results" / "calibration") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(result["unix_time"]))
    text = json.dumps(result, indent=2)
    (directory / f"{stamp}.json").write_text(text)
    (directory / "latest.json").write_text(text)
    return directory / "latest.json"
