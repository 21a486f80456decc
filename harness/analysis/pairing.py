"""Two recorded runs as the arms of one comparison (`bench compare RUN_A RUN_B`).

Every server of run A becomes arm A and every server of run B arm B; blocks are paired by
order (run A's first block with run B's first, ...). The comparison is `compare()`'s, plus
the doubts of comparing runs that were not interleaved.
"""

from __future__ import annotations

import time
from pathlib import PurePath

import pandas as pd

from harness.analysis.compare import Comparison, compare
from harness.analysis.summary import speaks

Run = tuple[dict, dict[str, pd.DataFrame]]  # a run directory's manifest and tables

SETUP = {  # what two runs should share for their difference to be the code's
    "scenario": ("name", "size", "model", "engine", "load"),
    "machine": ("host", "cpu", "cpus", "gpu", "torch", "cuda"),
    "": ("concurrency", "requests", "duration_s", "warmup", "period"),
}


def run_labels(path_a: str, path_b: str, manifest_a: dict, manifest_b: dict) -> dict[str, str]:
    """Each run's id (its directory's name without one), or the paths when the ids agree."""
    a = manifest_a.get("run_id") or PurePath(path_a).name
    b = manifest_b.get("run_id") or PurePath(path_b).name
    return {"A": a, "B": b} if a != b else {"A": str(path_a), "B": str(path_b)}


def pair_runs(
    a: Run, b: Run, labels: dict[str, str], command: str
) -> tuple[dict, dict[str, pd.DataFrame], Comparison]:
    """The two runs as one: a manifest, tables relabelled A and B, and their comparison."""
    runs = {"A": a, "B": b}
    first = _relabel(a[1], "A", labels["A"], first_slot=0)
    after = int(first["servers"]["slot"].max()) + 1
    second = _relabel(b[1], "B", labels["B"], first_slot=after)
    frames = {name: pd.concat([first[name], second[name]], ignore_index=True) for name in first}
    external = [x for x, (m, _) in runs.items() if any(arm["kind"] == "url" for arm in m["arms"])]
    result = compare(
        frames["requests"],
        frames["spans"],
        frames["servers"],
        labels,
        external=external,
        audio=speaks(a[0]),
        headline=a[0]["scenario"]["headline"],
    )
    result.doubts[:0] = _doubts(runs, labels)
    return _manifest(runs, labels, frames["servers"], command), frames, result


def _relabel(frames: dict, letter: str, label: str, first_slot: int) -> dict[str, pd.DataFrame]:
    """One run's rows as arm `letter`: blocks renumbered 0, 1, ... in order, slots moved to
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
            letter=letter,
            server=letter + frame["new_slot"].astype(str),
        )
        out[name] = frame.drop(columns=["new_block", "new_slot"])
    return out


def _manifest(runs: dict, labels: dict[str, str], servers: pd.DataFrame, command: str) -> dict:
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
        "command": command,
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
