"""`bench compare RUN_A RUN_B`: two recorded runs (e.g. last night's and today's) as arms A and B.

Every server of RUN_A becomes arm A and every server of RUN_B arm B; blocks are paired by
order (RUN_A's first block with RUN_B's first, ...). The result is `compare()`'s, with the
same tables as `bench run`, plus the doubts of comparing runs that were not interleaved.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd
import typer
from rich.console import Console

from harness.compare import Comparison, compare, render
from harness.errors import BenchError, fail
from harness.report import RESULTS, gather, write
from harness.results import load_run

SETUP = {  # what two runs should share for their difference to be the code's
    "scenario": ("name", "size", "model", "engine", "load"),
    "machine": ("host", "cpu", "cpus", "gpu", "torch", "cuda"),
    "": ("concurrency", "requests", "duration_s", "warmup", "period"),
}


def main(
    run_a: Path = typer.Argument(..., help="The baseline run directory (arm A)."),
    run_b: Path = typer.Argument(..., help="The run to judge against it (arm B)."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    report: Path | None = typer.Option(None, help="Write report.md and plots into this directory."),
    html: bool = typer.Option(False, "--html", help="With --report, also write report.html."),
) -> None:
    """Compare two runs' servers as arms A and B; exit 1 when B's headline figure is slower."""
    try:
        manifest, frames, result = pair_runs(run_a, run_b)
    except BenchError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        Console().print(render(result))
    if report is not None:
        path = write(gather(manifest, frames, result, RESULTS), report, html=html)
        Console(stderr=True, highlight=False).print(f"report: {path}")
    if result.regression:
        raise typer.Exit(1)


def pair_runs(path_a: Path, path_b: Path) -> tuple[dict, dict[str, pd.DataFrame], Comparison]:
    """The two runs as one: a manifest, frames relabelled A and B, and their comparison."""
    runs = {"A": load_run(path_a), "B": load_run(path_b)}
    for path, (_, frames) in zip((path_a, path_b), runs.values(), strict=True):
        if frames["servers"].empty:
            raise BenchError(f"{path} has no servers: nothing was measured; rerun it")
    labels = _labels(path_a, path_b, runs["A"][0], runs["B"][0])
    a = _relabel(runs["A"][1], "A", labels["A"], first_slot=0)
    b = _relabel(runs["B"][1], "B", labels["B"], first_slot=int(a["servers"]["slot"].max()) + 1)
    frames = {name: pd.concat([a[name], b[name]], ignore_index=True) for name in a}
    external = [x for x, (m, _) in runs.items() if any(arm["kind"] == "url" for arm in m["arms"])]
    result = compare(
        frames["requests"],
        frames["spans"],
        frames["servers"],
        labels,
        external=external,
        headline=runs["A"][0]["scenario"]["headline"],
    )
    result.doubts[:0] = _doubts(runs, labels)
    return _manifest(runs, labels, frames["servers"]), frames, result


def _relabel(frames: dict, letter: str, label: str, first_slot: int) -> dict[str, pd.DataFrame]:
    """One run's servers as arm `letter`: blocks renumbered 0, 1, ... in order, slots moved to
    start at `first_slot` (so both runs' servers of a paired block have their own slots)."""
    keys = frames["servers"][["block", "slot"]].drop_duplicates()
    keys["new_block"] = keys["block"].rank(method="dense").astype(int) - 1
    keys["new_slot"] = keys["slot"] - keys["slot"].min() + first_slot
    out = {}
    for name, frame in frames.items():
        frame = frame.merge(keys, on=["block", "slot"])
        frame = frame.assign(
            block=frame["new_block"],
            slot=frame["new_slot"],
            arm=label + "/" + frame["arm"].astype(str),
        )
        out[name] = frame.drop(columns=["new_block", "new_slot"])
    out["servers"]["letter"] = letter
    return out


def _labels(path_a: Path, path_b: Path, manifest_a: dict, manifest_b: dict) -> dict[str, str]:
    a = manifest_a.get("run_id") or Path(path_a).name
    b = manifest_b.get("run_id") or Path(path_b).name
    return {"A": a, "B": b} if a != b else {"A": str(path_a), "B": str(path_b)}


def _manifest(runs: dict, labels: dict[str, str], servers: pd.DataFrame) -> dict:
    (a, _), (b, _) = runs["A"], runs["B"]

    def either(key: str):
        return a.get(key) if a.get(key) == b.get(key) else f"{a.get(key)} vs {b.get(key)}"

    arms = [
        {**arm, "letter": letter, "name": f"{labels[letter]}: {arm['name']}"}
        for letter, (manifest, _) in runs.items()
        for arm in manifest["arms"]
    ]
    return {
        "run_id": f"{labels['A']} vs {labels['B']}",
        "command": " ".join(sys.argv),
        "scenario": a["scenario"],
        "arms": arms,
        "machine": a.get("machine"),
        "schedule": servers.sort_values(["block", "slot"])["letter"].tolist(),
        **{key: either(key) for key in ("concurrency", "requests", "duration_s", "warmup")},
        "complete": bool(a.get("complete") and b.get("complete")),
    }


def _doubts(runs: dict, labels: dict[str, str]) -> list[str]:
    (a, frames_a), (b, frames_b) = runs["A"], runs["B"]
    when = {
        x: time.strftime("%Y-%m-%d %H:%M", time.localtime(f["servers"]["start_unix"].min()))
        for x, (_, f) in runs.items()
    }
    doubts = [
        f"A and B are two runs (A {when['A']}, B {when['B']}), not interleaved: drift between"
        " them (machine load, other tenants, thermals) counts as change; an ABBA run of both"
        " builds is the stronger test"
    ]
    differ = [
        f"{section + '.' if section else ''}{key} ({_get(a, section, key)} vs {_get(b, section, key)})"
        for section, keys in SETUP.items()
        for key in keys
        if _get(a, section, key) != _get(b, section, key)
    ]
    if differ:
        doubts.append("the runs differ in setup: " + "; ".join(differ))
    blocks = [f["servers"]["block"].nunique() for f in (frames_a, frames_b)]
    if blocks[0] != blocks[1]:
        doubts.append(
            f"A has {blocks[0]} blocks, B {blocks[1]}: paired by order, the rest unpaired"
        )
    for letter, (manifest, _) in runs.items():
        if not manifest.get("complete", False):
            doubts.append(f"run {labels[letter]} did not finish: partial data")
    return doubts


def _get(manifest: dict, section: str, key: str):
    return (manifest.get(section) or {}).get(key) if section else manifest.get(key)
