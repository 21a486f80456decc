"""What ran beside a slot: the CPU that processes outside the run used during its steady window
and, on a CUDA machine, the GPU's SM clock and the other processes on the GPU.

A thread samples, every `INTERVAL_S` from before the load to after it (never on the load's
per-token path), the machine's busy CPU time (/proc/stat: user + nice + system) and the CPU
time of the run's own processes: the bench process and every descendant (its load shards, the
server's API process, its worker and their children), plus, for a URL arm served on this
machine, the processes listening on its port (utime + stime + cutime + cstime of each, from
/proc/<pid>/stat; a reaped child's time is in its parent's cutime, so the sum only grows).
Once the load has ended and its steady window is known, the samples that bracket the window
(the last at or before its start, the first at or after its end) give the window's figures:
the outside CPU is the machine's busy time less the run's, in cores (CPU-seconds over the
sampled seconds) and as a share of the machine's CPUs. Where /proc or nvidia-smi is absent a
figure is None, never an error.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import urlsplit

INTERVAL_S = 0.5  # a full /proc scan costs ~0.6 ms of CPU at 80 processes
GPU_INTERVAL_S = 1.0  # nvidia-smi takes tens of ms; its CPU counts as the run's own
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROC = Path("/proc")


@dataclass(frozen=True)
class Sample:
    t: float  # time.perf_counter()
    machine_ticks: int | None  # busy CPU time of the whole machine, clock ticks
    run_ticks: int  # CPU time of the run's processes (reaped children included), clock ticks
    run_pids: frozenset[int]
    sm_clock_mhz: float | None = None
    gpu_pids: frozenset[int] | None = None  # compute processes on the GPU; None: not probed


@dataclass(frozen=True)
class Interference:
    """One window's figures, named as ServerRecord's columns (docs/RESULTS.md)."""

    sampled_s: float | None = None  # the seconds the bracketing samples span
    machine_cpus: int | None = None
    run_cpu_cores: float | None = None
    outside_cpu_cores: float | None = None
    outside_cpu_share: float | None = None  # outside_cpu_cores / machine_cpus
    gpu_sm_clock_min_mhz: float | None = None
    gpu_sm_clock_mean_mhz: float | None = None
    gpu_other_processes: int | None = None
    gpu_other_pids: str | None = None  # comma-separated

    def stamp(self, record) -> None:
        """Set these figures on a ServerRecord."""
        for f in fields(self):
            setattr(record, f.name, getattr(self, f.name))


def machine_ticks() -> int | None:
    """user + nice + system of /proc/stat's `cpu` line (guest time is inside user and nice)."""
    try:
        first = (PROC / "stat").read_text().split("\n", 1)[0].split()
        return int(first[1]) + int(first[2]) + int(first[3])
    except (OSError, ValueError, IndexError):
        return None


def machine_cpus() -> int | None:
    try:
        lines = (PROC / "stat").read_text().splitlines()
    except OSError:
        return None
    return sum(line.startswith("cpu") and line[3:4].isdigit() for line in lines) or None


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, utime + stime + cutime + cstime in clock ticks), every process."""
    table = {}
    try:
        names = os.listdir(PROC)
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(PROC / name / "stat", "rb") as f:
                stat = f.read()
            rest = stat[stat.rindex(b")") + 2 :].split()
            table[int(name)] = (int(rest[1]), sum(int(x) for x in rest[11:15]))
        except (OSError, ValueError, IndexError):
            continue  # it exited while being read
    return table


def descendants(table: dict[int, tuple[int, int]], roots: Iterable[int]) -> set[int]:
    """The roots that are alive and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [pid for pid in roots if pid in table]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def is_local(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def listening_pids(port: int) -> set[int]:
    """The processes holding a socket that listens on `port` (TCP, v4 or v6): a local URL
    arm's server (several, for a mock sharing its port). Empty where /proc says nothing."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    pids = set()
    for pid in (p for p in os.listdir(PROC) if p.isdigit()) if inodes else ():
        try:
            if any(os.readlink(fd) in inodes for fd in (PROC / pid / "fd").iterdir()):
                pids.add(int(pid))
        except OSError:
            continue  # gone, or another user's
    return pids


class GpuProbe:
    """The GPU's SM clock and compute processes through nvidia-smi (absent: no probe). The GPU
    is the first of CUDA_VISIBLE_DEVICES (an index or a UUID), else GPU 0: the server's."""

    def __init__(self, tool: str | None = None):
        self.tool = tool or shutil.which("nvidia-smi")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        self.device = visible or "0"

    def read(self) -> tuple[float | None, frozenset[int] | None]:
        clock = self._query("--query-gpu=clocks.sm", "--format=csv,noheader,nounits")
        apps = self._query("--query-compute-apps=pid", "--format=csv,noheader")
        try:
            mhz = float(clock[0]) if clock else None
        except ValueError:
            mhz = None
        try:
            pids = None if apps is None else frozenset(int(a) for a in apps)
        except ValueError:
            pids = None
        return mhz, pids

    def _query(self, *args: str) -> list[str] | None:
        try:
            done = subprocess.run(
                [self.tool, "-i", self.device, *args], capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        return [line.strip() for line in done.stdout.splitlines() if line.strip()]


class Sampler:
    """Samples from `start` to `stop` in a thread; `window` gives a window's figures. `roots`:
    the run's processes (with their descendants); default the bench process. `local_url`: a
    URL arm on this machine whose server is found by its port (not found: no CPU figures)."""

    def __init__(
        self,
        roots: Iterable[int] | None = None,
        local_url: str | None = None,
        interval_s: float = INTERVAL_S,
        gpu: GpuProbe | None = None,
    ):
        self.roots = set(roots if roots is not None else [os.getpid()])
        self.known = True  # whether every process of the run is among the roots
        if local_url is not None and is_local(local_url):
            servers = listening_pids(urlsplit(local_url).port or 80)
            self.roots |= servers
            self.known = bool(servers)
        self.interval_s = interval_s
        self.gpu = gpu if gpu is not None else GpuProbe()
        self.cpus = machine_cpus()
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="interference", daemon=True)
        self._gpu_at = -float("inf")

    def __enter__(self) -> Sampler:
        self._take(gpu=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._take(gpu=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def _take(self, gpu: bool = False) -> None:
        t = time.perf_counter()
        busy, table = machine_ticks(), process_table()
        pids = descendants(table, self.roots)
        mhz = gpu_pids = None
        if self.gpu.tool and (gpu or t - self._gpu_at >= GPU_INTERVAL_S):
            self._gpu_at = t
            mhz, gpu_pids = self.gpu.read()
        run = sum(table[p][1] for p in pids)
        self.samples.append(Sample(t, busy, run, frozenset(pids), mhz, gpu_pids))

    def steady(self, load) -> Interference:
        """The figures of a load's steady window (a LoadResult's, on its clock)."""
        start, end = load.steady_start_s, load.steady_end_s
        if start is None or end is None:
            return Interference()
        return self.window(load.t0_perf + start, load.t0_perf + end)

    def window(self, start: float | None, end: float | None) -> Interference:
        """The figures of the window [start, end] (perf_counter seconds), from the samples
        that bracket it; every figure None when there is no window or no two samples."""
        if start is None or end is None or len(self.samples) < 2:
            return Interference()
        before = [s for s in self.samples if s.t <= start] or self.samples[:1]
        after = [s for s in self.samples if s.t >= end] or self.samples[-1:]
        first, last = before[-1], after[0]
        if last.t <= first.t:
            return Interference()
        inside = [s for s in self.samples if first.t <= s.t <= last.t]
        return Interference(
            sampled_s=last.t - first.t,
            machine_cpus=self.cpus,
            **self._cpu(first, last),
            **_gpu(inside),
        )

    def _cpu(self, first: Sample, last: Sample) -> dict:
        if first.machine_ticks is None or last.machine_ticks is None or not self.known:
            return {}
        span = last.t - first.t
        run = (last.run_ticks - first.run_ticks) / CLK_TCK / span
        busy = (last.machine_ticks - first.machine_ticks) / CLK_TCK / span
        outside = max(0.0, busy - run)  # below 0 only by the ticks' rounding
        share = outside / self.cpus if self.cpus else None
        return {"run_cpu_cores": run, "outside_cpu_cores": outside, "outside_cpu_share": share}


def _gpu(samples: list[Sample]) -> dict:
    """SM clock min and mean over the samples, and the GPU's compute processes that are not
    the run's (seen in any sample)."""
    clocks = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
    probed = [s.gpu_pids for s in samples if s.gpu_pids is not None]
    out = {}
    if clocks:
        out |= {"gpu_sm_clock_min_mhz": min(clocks)}
        out |= {"gpu_sm_clock_mean_mhz": sum(clocks) / len(clocks)}
    if probed:
        ours = frozenset().union(*(s.run_pids for s in samples))
        others = sorted(frozenset().union(*probed) - ours)
        out |= {"gpu_other_processes": len(others), "gpu_other_pids": ",".join(map(str, others))}
    return out
