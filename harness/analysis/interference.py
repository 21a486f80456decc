"""Interference: whether what ran beside the run's servers (the servers table's interference
columns, measure/interference.py) differed enough between them to move a comparison.

ABBA blocks cancel a drift that is linear in time, not a neighbour that comes and goes: a job
that burns CPU beside two of B's servers makes B slower (or, taking the cores A's servers
would have shared with it, A) by as much as the neighbour takes. So a run whose arms differ in
the CPU used beside them, or one of whose servers had much more beside it than the rest, or
beside some of whose servers another process used the GPU and not beside others, gets a doubt
that withholds its verdict (docs/STATISTICS.md, "Interference"). The bounds are shares of the
machine's CPUs, chosen from measurements on a 2-CPU machine (there): beside a steady
neighbour one server's outside share varied by 0.013 (sd) from server to server, and a hog
that took 0.15-0.35 cores more cost the run 7-44% of its output tok/s.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from harness.analysis.schema import LETTERS

RERUN = "rerun on a quiet machine"


@dataclass(frozen=True)
class Bounds:
    """How far what ran beside the servers may differ, as shares of the machine's CPUs."""

    arms_gap: float = 0.03  # the arms' mean outside CPU (0.06 cores of 2)
    server_excess: float = 0.06  # one server's above the run's median server's (0.12 of 2)


def interference_doubt(servers: pd.DataFrame, bounds: Bounds = Bounds()) -> str | None:
    """The doubt for the servers a comparison stands on (both arms'), or None: no difference
    beyond the bounds, or nothing measured (a run before schema version 4, no /proc)."""
    said = [s for s in (_cpu_doubt(servers, bounds), _gpu_doubt(servers)) if s is not None]
    return None if not said else "interference: " + "; ".join(said) + f"; {RERUN}"


def _column(servers: pd.DataFrame, name: str) -> pd.Series:
    if name not in servers:
        return pd.Series(float("nan"), index=servers.index)
    return pd.to_numeric(servers[name], errors="coerce")


def _cpu_doubt(servers: pd.DataFrame, bounds: Bounds) -> str | None:
    share = _column(servers, "outside_cpu_share")
    cores = _column(servers, "outside_cpu_cores")
    measured = servers.assign(share=share, cores=cores)[share.notna() & cores.notna()]
    if measured.empty:
        return None
    cpus = int(_column(measured, "machine_cpus").max())
    said = []
    arms = measured.groupby("letter")[["share", "cores"]].mean()
    if all(letter in arms.index for letter in LETTERS):
        a, b = arms.loc["A"], arms.loc["B"]
        if abs(b["share"] - a["share"]) > bounds.arms_gap:
            said.append(
                f"processes outside the run used {a['cores']:.2f} of {cpus} CPUs beside A's"
                f" servers and {b['cores']:.2f} beside B's on average (the arms may differ by"
                f" {bounds.arms_gap * cpus:.2f})"
            )
    median = measured["share"].median()
    beyond = measured[measured["share"] > median + bounds.server_excess]
    if not beyond.empty:
        named = ", ".join(
            f"{row.server} {row.cores:.2f}"
            for row in beyond.sort_values("cores", ascending=False).itertuples()
        )
        said.append(
            f"beside {named} CPUs (the median server {median * cpus:.2f}; a server may exceed it"
            f" by {bounds.server_excess * cpus:.2f})"
        )
    return "; ".join(said) or None


def _gpu_doubt(servers: pd.DataFrame) -> str | None:
    """Other GPU processes beside some servers and not (as many) beside others: a neighbour
    that came and went. One present throughout falls on every server alike."""
    others = _column(servers, "gpu_other_processes")
    pids = servers["gpu_other_pids"] if "gpu_other_pids" in servers else None
    measured = servers.assign(others=others, pids=pids)[others.notna()]
    if measured.empty or measured["others"].nunique() == 1:
        return None
    fewest = measured["others"].min()
    more = measured[measured["others"] > fewest]
    named = ", ".join(
        f"{row.server} ({int(row.others)}: pids {row.pids or '?'})" for row in more.itertuples()
    )
    return (
        f"other processes used the GPU beside {named}, and {int(fewest)} beside the other"
        f" {len(measured) - len(more)} servers"
    )
