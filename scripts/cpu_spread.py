"""Where a CPU run's server-to-server spread comes from: an A/A experiment per candidate.

Each candidate is one way to run the README's main command's servers (qwen35 tiny, c=64):
the processes laid out on cores or not (harness/measure/cpu_layout.py), the steady window's
length (measured requests per server), the load generator's garbage collector. The script
starts `--rounds` fresh servers of the same code for each candidate, the candidates' order
rotating from round to round (so drift and a neighbour fall on all of them alike), and
prints one row per candidate: the servers' steady output tok/s (mean, coefficient of
variation, max/min - 1), the steady window, rows per step and prefill steps in it, each
process's CPU (cores) over the load, and the machine's load average. docs/STATISTICS.md,
"Noise on a CPU", holds its figures.

    python scripts/cpu_spread.py --rounds 4
    python scripts/cpu_spread.py --rounds 6 --candidates shared,pinned --tree /tmp/head
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import env  # noqa: E402
from engine.models import vocab_size  # noqa: E402
from harness.analysis.metrics import steady_tok_per_s  # noqa: E402
from harness.analysis.schema import Slot  # noqa: E402
from harness.measure.cpu_layout import cpu_layout, pinned  # noqa: E402
from harness.measure.event_loop import run_loop  # noqa: E402
from harness.measure.loadgen import run_load  # noqa: E402
from harness.measure.request_sequence import build_requests  # noqa: E402
from harness.measure.server import ServerProcess, group_members  # noqa: E402
from harness.measure.spans import SpanCollector  # noqa: E402
from harness.scenario import load_scenario  # noqa: E402


@dataclass(frozen=True)
class Candidate:
    name: str
    layout: bool  # the processes on cores of their own (cpu_layout)
    requests_factor: int = 1  # measured requests: the scenario's times this
    client_gc: bool = True  # the load generator's garbage collector on during the load
    overrides: str | None = None  # scenario overrides (`--set`), e.g. the scheduler's


CANDIDATES = {
    c.name: c
    for c in (
        Candidate("shared", layout=False),
        Candidate("pinned", layout=True),
        Candidate("shared-long", layout=False, requests_factor=4),
        Candidate("pinned-long", layout=True, requests_factor=4),
        Candidate("pinned-nogc", layout=True, client_gc=False),
        Candidate("shared-hold", layout=False, overrides="engine.prefill_hold_steps=8"),
        Candidate("pinned-hold", layout=True, overrides="engine.prefill_hold_steps=8"),
        Candidate("pinned-mixing", layout=True, overrides="engine.mixing=true"),
    )
}


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sched(pid: int) -> dict[str, float]:
    """The kernel's count of a process's moves between cores and of its preemptions."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/sched").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() in ("se.nr_migrations", "nr_involuntary_switches"):
                out[name.strip()] = float(value)
    except OSError:
        pass
    return out


def _busy_s() -> float:
    """CPU seconds every process has used (/proc/stat: user nice system irq softirq steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields[:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")


def _worker_pid(server: ServerProcess) -> int | None:
    others = [p for p in group_members(server.proc.pid) if p != server.proc.pid]
    return others[0] if others else None


def one_server(candidate: Candidate, scenario, collector, tree, number: int) -> dict:
    load = scenario.load
    layout = cpu_layout("cpu") if candidate.layout else None
    environment = env.timing_environment(100, span_addr=collector.address)
    if layout is not None:
        environment |= layout.worker_environment()
    count = load.requests * candidate.requests_factor
    requests = build_requests(load, vocab_size(scenario.model), count + load.warmup)
    slot = Slot(candidate.name, "A", f"A{number}", 0, number)
    server = ServerProcess(
        scenario.name,
        size="tiny",
        cwd=tree,
        server_id=slot.server,
        env=environment,
        overrides=candidate.overrides,
        cpus=layout.api if layout else None,
    )
    server.start()
    try:
        server.wait_healthy(300)
        worker = _worker_pid(server)
        pids = {"api": server.proc.pid, "worker": worker, "client": os.getpid()}
        before = {k: _cpu_s(p) for k, p in pids.items() if p}
        load_avg = os.getloadavg()[0]
        sched, busy = _sched(worker) if worker else {}, _busy_s()
        wall = time.perf_counter()
        with pinned(layout.client if layout else None):
            if not candidate.client_gc:
                gc.disable()
            try:
                result = run_loop(
                    run_load(server.url, requests, 64, load.warmup, slot, model=scenario.name)
                )
            finally:
                gc.enable()
        wall = time.perf_counter() - wall
        cores = {f"{k}_cores": (_cpu_s(p) - before[k]) / wall for k, p in pids.items() if p}
        cores["outside_cores"] = (_busy_s() - busy) / wall - sum(cores.values())
        after = _sched(worker) if worker else {}
        cores["worker_migrations"] = after.get("se.nr_migrations", 0) - sched.get(
            "se.nr_migrations", 0
        )
        cores["worker_preempted"] = after.get("nr_involuntary_switches", 0) - sched.get(
            "nr_involuntary_switches", 0
        )
        affinity = sorted(os.sched_getaffinity(worker)) if worker else None
    finally:
        server.stop()
    spans = collector.take(slot, 2.0)
    frame = pd.DataFrame([asdict(r) for r in result.records])
    window = (result.steady_start_s, result.steady_end_s)
    tok_s = steady_tok_per_s(frame, window if None not in window else None)
    lo, hi = (result.t0_unix + w for w in window) if None not in window else (0.0, 0.0)
    steps = _steady_steps(spans, lo, hi)
    tokens = tok_s * (hi - lo)
    return {
        "candidate": candidate.name,
        "tok_s": tok_s,
        "window_s": hi - lo if hi > lo else float("nan"),
        "tokens_per_step": tokens / steps["steps"] if steps["steps"] else np.nan,
        "ms_per_step": 1e3 * (hi - lo) / steps["steps"] if steps["steps"] else np.nan,
        "prefill_share": steps["prefill"] / steps["steps"] if steps["steps"] else np.nan,
        "load_avg": load_avg,
        "worker_affinity": affinity,
        **cores,
    }


def _steady_steps(spans, lo: float, hi: float) -> dict[str, float]:
    """The worker's iterations and prefill steps inside the steady window [lo, hi] (unix s):
    each span window's counts weighted by the share of it inside (a window of `period`
    iterations lasts seconds, as long as the steady window itself)."""
    out = {"steps": 0.0, "prefill": 0.0}
    for s in spans:
        if s.name not in ("worker.rows_per_step", "worker.prefill_steps"):
            continue
        span = max(s.end_unix - s.start_unix, 1e-9)
        share = max(0.0, min(s.end_unix, hi) - max(s.start_unix, lo)) / span
        key = "steps" if s.name == "worker.rows_per_step" else "prefill"
        out[key] += share * (s.n if key == "steps" else s.sum)
    return out


def table(rows: pd.DataFrame) -> pd.DataFrame:
    def spread(x):
        return x.max() / x.min() - 1

    grouped = rows.groupby("candidate", sort=False)
    out = grouped["tok_s"].agg(["count", "mean", "std", spread])
    out["cv"] = out.pop("std") / out["mean"]
    for column in ("tokens_per_step", "ms_per_step"):  # tok/s = the one over the other
        out[f"{column}_cv"] = grouped[column].std() / grouped[column].mean()
    for column in ("window_s", "tokens_per_step", "prefill_share", "load_avg"):
        out[column] = grouped[column].mean()
    for column in (
        "worker_cores",
        "api_cores",
        "client_cores",
        "outside_cores",
        "worker_migrations",
        "worker_preempted",
    ):
        if column in rows:
            out[column] = grouped[column].mean()
    return out.round(3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="fresh servers per candidate")
    parser.add_argument("--candidates", default="shared,pinned,pinned-long,pinned-hold")
    parser.add_argument("--tree", default=None, help="the engine tree to serve (default: this)")
    parser.add_argument("--csv", default=None, help="also write every server's row here")
    args = parser.parse_args()
    names = args.candidates.split(",")
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        parser.error(f"unknown candidates {unknown}; known: {', '.join(CANDIDATES)}")
    scenario = load_scenario("qwen35", "tiny")
    collector = SpanCollector()
    rows = []
    try:
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                row = one_server(CANDIDATES[name], scenario, collector, args.tree, len(rows))
                rows.append(row)
                print(
                    f"round {round_} {name:12s} {row['tok_s']:7.1f} tok/s"
                    f" window {row['window_s']:.1f} s load {row['load_avg']:.2f}",
                    flush=True,
                )
    finally:
        collector.close()
    frame = pd.DataFrame(rows)
    if args.csv:
        frame.to_csv(args.csv, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table(frame))
    print(f"load average now: {os.getloadavg()}")


if __name__ == "__main__":
    main()
