"""Interference: the CPU outside the run beside a window (measure/interference.py, INVARIANTS
66) and the doubt it gives a comparison (analysis/interference.py, docs/STATISTICS.md)."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

from harness.analysis import schema
from harness.analysis.interference import Bounds, interference_doubt
from harness.measure import interference as m
from harness.measure.interference import GpuProbe, Interference, Sample, Sampler

HOG = [sys.executable, "-c", "while True: pass"]


def _no_gpu() -> GpuProbe:
    probe = GpuProbe()
    probe.tool = None  # even on a CUDA machine
    return probe


NO_GPU = _no_gpu()


def _cores(pid: int, seconds: float) -> float:
    """The CPU cores a process used over `seconds`, from its own /proc stat."""
    before = m.process_table()[pid][1]
    time.sleep(seconds)
    return (m.process_table()[pid][1] - before) / m.CLK_TCK / seconds


def test_interference_names_the_servers_columns():
    names = [f for f in Interference.__dataclass_fields__]
    assert names == list(schema.INTERFERENCE)
    assert set(names) <= set(schema.columns("servers"))


# The measurement, on this machine's /proc.


def test_a_hog_outside_the_run_is_seen():
    """INVARIANTS 66: a process outside the run burning CPU beside the window is counted as
    outside CPU (at least what its own /proc stat says it used)."""
    idle = subprocess.Popen(["sleep", "30"])  # the run: one idle process
    hog = subprocess.Popen(HOG)
    try:
        time.sleep(0.3)
        with Sampler(roots=[idle.pid], interval_s=0.25, gpu=NO_GPU) as sampler:
            start = time.perf_counter()
            hog_s = 1.5 * _cores(hog.pid, 1.5)
            end = time.perf_counter()
        figures = sampler.window(start, end)
    finally:
        for p in (hog, idle):
            p.kill()
            p.wait()
    assert hog_s > 0.45  # the hog ran (on a busy 2-CPU machine it gets a share)
    assert figures.run_cpu_cores < 0.05
    assert figures.outside_cpu_cores * figures.sampled_s >= hog_s - 0.05
    assert figures.outside_cpu_share == pytest.approx(figures.outside_cpu_cores / m.machine_cpus())


def test_the_runs_own_work_is_not_outside():
    """INVARIANTS 66: the run's own processes (here this one and a child that burns CPU and is
    reaped inside the window) are the run's CPU, to within a few clock ticks, not outside."""
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.8: pass"
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with Sampler(interval_s=0.25, gpu=NO_GPU) as sampler:
        start, own0 = time.perf_counter(), time.process_time()
        subprocess.run([sys.executable, "-c", code], check=True)
        time.sleep(0.3)
        end, own = time.perf_counter(), time.process_time() - own0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = (children.ru_utime + children.ru_stime) - (children0.ru_utime + children0.ru_stime)
    figures = sampler.window(start, end)
    run_s = figures.run_cpu_cores * figures.sampled_s
    assert child > 0.7
    assert child + own - 0.05 <= run_s <= child + own + 0.1  # a few ticks' rounding


def test_no_window_or_one_sample_gives_no_figures():
    sampler = Sampler(gpu=NO_GPU)
    assert sampler.window(None, 1.0) == Interference()
    sampler._take()
    assert sampler.window(0.0, 1.0) == Interference()


def test_no_proc_gives_no_cpu_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(m, "PROC", tmp_path / "absent")
    with Sampler(gpu=NO_GPU) as sampler:
        start = time.perf_counter()
    figures = sampler.window(start, time.perf_counter())
    assert figures.sampled_s > 0 and figures.machine_cpus is None
    assert figures.outside_cpu_cores is None and figures.run_cpu_cores is None


def test_the_figures_are_the_bracketing_samples_difference(monkeypatch):
    """A known answer: the samples at or before the window's start and at or after its end,
    machine ticks less the run's over the seconds between them."""
    monkeypatch.setattr(m, "CLK_TCK", 100)
    sampler = Sampler(gpu=NO_GPU)
    sampler.cpus = 4
    sampler.samples = [
        Sample(10.0, 1_000, 50, frozenset({1})),
        Sample(11.0, 1_300, 100, frozenset({1})),  # the window's first bracket (start 11.5)
        Sample(12.0, 1_600, 150, frozenset({1})),
        Sample(13.0, 1_800, 300, frozenset({1})),  # its last (end 12.5)
        Sample(14.0, 2_600, 400, frozenset({1})),
    ]
    figures = sampler.window(11.5, 12.5)
    assert figures.sampled_s == 2.0
    assert figures.run_cpu_cores == pytest.approx(1.0)  # (300 - 100) ticks over 2 s
    assert figures.outside_cpu_cores == pytest.approx(1.5)  # (500 - 200) ticks over 2 s
    assert figures.outside_cpu_share == pytest.approx(0.375)
    sampler.samples[3] = Sample(13.0, 1_500, 300, frozenset({1}))  # all the busy time ours
    assert sampler.window(11.5, 12.5).outside_cpu_cores == 0.0
    sampler.samples[3] = Sample(13.0, 1_480, 300, frozenset({1}))  # and the ticks' rounding
    assert sampler.window(11.5, 12.5).outside_cpu_cores == 0.0


def test_the_process_tree_and_a_name_with_parentheses(tmp_path, monkeypatch):
    (tmp_path / "7").mkdir()
    fields = "S 1 7 7 0 -1 0 0 0 0 0 11 22 33 44 20 0"
    (tmp_path / "7" / "stat").write_text(f"7 (a) b) c) {fields}\n")
    monkeypatch.setattr(m, "PROC", tmp_path)
    assert m.process_table() == {7: (1, 110)}
    table = {1: (0, 0), 2: (1, 0), 3: (2, 0), 4: (1, 0), 5: (9, 0)}
    assert m.descendants(table, [2]) == {2, 3}
    assert m.descendants(table, [1, 99]) == {1, 2, 3, 4}


def test_a_local_url_arms_server_is_found_by_its_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert os.getpid() in m.listening_pids(port)
        assert m.is_local(f"http://127.0.0.1:{port}") and m.is_local("http://localhost:1")
        assert not m.is_local("http://10.1.2.3:8000")
        sampler = Sampler(roots=[], local_url=f"http://localhost:{port}", gpu=NO_GPU)
        assert os.getpid() in sampler.roots and sampler.known
    unknown = Sampler(roots=[], local_url=f"http://127.0.0.1:{port}", gpu=NO_GPU)
    assert not unknown.known  # nothing listens: its server's CPU would read as outside
    unknown.samples = [Sample(0.0, 0, 0, frozenset()), Sample(1.0, 100, 0, frozenset())]
    assert unknown.window(0.0, 1.0).outside_cpu_cores is None


def _fake_smi(tmp_path, clocks: list[str], apps: str, code: int = 0) -> str:
    """An nvidia-smi that answers each clock query with the next of `clocks`."""
    (tmp_path / "clocks").write_text("\n".join(clocks))
    tool = tmp_path / "nvidia-smi"
    tool.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in
          *query-gpu*) head -1 {tmp_path}/clocks; sed -i 1d {tmp_path}/clocks ;;
          *) printf '{apps}' ;;
        esac
        exit {code}
        """)
    )
    tool.chmod(0o755)
    return str(tool)


def test_the_gpus_clock_and_other_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(m, "GPU_INTERVAL_S", 0.0)
    tool = _fake_smi(tmp_path, ["1980", "1500", "1755"], f"{os.getpid()}\\n4242\\n")
    with Sampler(interval_s=0.5, gpu=GpuProbe(tool)) as sampler:
        start = time.perf_counter()
        time.sleep(0.7)  # one sample between the first and the last
        end = time.perf_counter()
    figures = sampler.window(start, end)
    assert (figures.gpu_sm_clock_min_mhz, figures.gpu_sm_clock_mean_mhz) == (1500, 1745)
    assert (figures.gpu_other_processes, figures.gpu_other_pids) == (1, "4242")


def test_no_or_a_failing_nvidia_smi_gives_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert GpuProbe().tool is None
    assert GpuProbe(_fake_smi(tmp_path, ["x"], "", code=9)).read() == (None, None)
    assert GpuProbe(_fake_smi(tmp_path, ["n/a"], "oops\\n")).read() == (None, None)


# The doubt, on synthetic servers tables.


def _servers(outside: dict[str, float], cpus: int = 2, gpu: dict[str, int] | None = None):
    rows = [
        {
            "letter": name[0],
            "server": name,
            "outside_cpu_cores": cores,
            "outside_cpu_share": cores / cpus,
            "machine_cpus": cpus,
            "gpu_other_processes": (gpu or {}).get(name, np.nan if gpu is None else 0),
            "gpu_other_pids": "77" if (gpu or {}).get(name) else "",
        }
        for name, cores in outside.items()
    ]
    return pd.DataFrame(rows)


QUIET = {"A0": 0.05, "B1": 0.08, "B2": 0.04, "A3": 0.06, "B4": 0.07, "A5": 0.03}


def test_quiet_servers_give_no_doubt():
    assert interference_doubt(_servers(QUIET)) is None
    assert interference_doubt(_servers(QUIET, gpu=dict.fromkeys(QUIET, 1))) is None


def test_arms_that_differ_beside_them_get_a_doubt():
    busy_b = {**QUIET, "B1": 0.45, "B2": 0.40, "B4": 0.35}  # B's mean 0.40, A's 0.047
    doubt = interference_doubt(_servers(busy_b))
    assert doubt.startswith("interference: ") and doubt.endswith("rerun on a quiet machine")
    assert "0.05 of 2 CPUs beside A's servers and 0.40 beside B's" in doubt
    assert "differ by 0.06" in doubt
    just_under = {**QUIET, "B1": 0.09, "B2": 0.10, "B4": 0.11}  # the gap 0.053 cores: < 0.06
    assert interference_doubt(_servers(just_under)) is None


def test_the_measured_hog_is_beyond_the_bounds_and_the_steady_neighbour_within():
    """The shares measured on the 2-CPU machine (docs/STATISTICS.md, "Interference"): alone
    beside a steady neighbour 0.46-0.49; beside a CPU hog 0.54-0.65."""
    alone = {"A0": 0.96, "B1": 0.93, "B2": 0.98, "A3": 0.97, "B4": 0.92, "A5": 0.97}
    assert interference_doubt(_servers(alone)) is None
    hog_beside_b = {**alone, "B1": 1.08, "B4": 1.25}
    assert "beside A's servers" in interference_doubt(_servers(hog_beside_b))


def test_one_server_with_a_neighbour_is_named():
    doubt = interference_doubt(_servers({**QUIET, "A3": 0.95}))
    assert "beside A3 0.95 CPUs (the median server 0.06" in doubt
    assert "B1" not in doubt
    assert interference_doubt(_servers({**QUIET, "A3": 0.95}), Bounds(0.2, 0.45)) is None
    # on a 64-CPU machine the same cores are 1.5% of it: no doubt
    assert interference_doubt(_servers({**QUIET, "A3": 0.95}, cpus=64)) is None


def test_a_gpu_neighbour_that_came_and_went_is_named():
    doubt = interference_doubt(_servers(QUIET, gpu={"B2": 1}))
    assert "other processes used the GPU beside B2 (1: pids 77), and 0 beside the other 5" in doubt
    assert doubt.endswith("rerun on a quiet machine")


def test_older_runs_and_unmeasured_servers_give_no_doubt():
    rows = [
        asdict(schema.ServerRecord("a", x, f"{x}{i}", 0, i, 1, "log", 0.0, 0.0))
        for i, x in enumerate("AB")
    ]
    old = pd.DataFrame(rows).drop(columns=list(schema.INTERFERENCE))  # a version-3 table
    assert interference_doubt(old) is None
    upgraded = schema.upgrade({"requests": schema.empty("requests"), "servers": old}, 3)
    assert list(upgraded["servers"]) == schema.columns("servers")
    assert upgraded["servers"]["outside_cpu_cores"].isna().all()
    assert interference_doubt(upgraded["servers"]) is None
    unmeasured = _servers(QUIET).assign(outside_cpu_cores=None, outside_cpu_share=None)
    assert interference_doubt(unmeasured) is None
