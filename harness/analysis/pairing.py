"""Recorded runs as the arms of one comparison (`bench compare RUNS_A RUNS_B`).

Every server of side A's runs becomes arm A and every server of side B's arm B. Between
recorded runs the unit of replication is the run, not the server or the block: whatever
differed between two runs (the machine's load that day, other tenants, thermals) moves
every server of a run together, so a run's blocks are no replicates of a change between
runs. Each run is one block of the comparison (its `block` column names the run) and
`compare(unit=BETWEEN_RUNS)` judges the runs' means: with one run a side the change is
descriptive, with no interval and no verdict; with two or more a side, a t-interval over
runs and a verdict (stats.run_change).
"""

from __future__ import annotations

import time
from pathlib import PurePath

import pandas as pd

from harness.analysis.compare import compare
from harness.analysis.comparison import Comparison
from harness.analysis.stats import BETWEEN_RUNS
from harness.analysis.summary import speaks, without_failed_servers
from harness.analysis.verdict import Rule

Run = tuple[dict, dict[str, pd.DataFrame]]  # a run directory's manifest and tables

SETUP = {  # what two runs should share for their difference to be the code's
    "scenario": ("name", "size", "model", "engine", "load"),
    "machine": ("host", "cpu", "cpus", "gpu", "torch", "cuda"),
    "": ("concurrency", "load", "requests", "duration_s", "warmup", "period"),
}


def side_label(paths: list[str], manifests: list[dict]) -> str:
    """A side's name: its run's id (or directory name), or for several runs the directory
    holding them and their number."""
    if len(paths) == 1:
        return manifests[0].get("run_id") or PurePath(paths[0]).name
    parent = PurePath(paths[0]).parent
    return f"{parent.name or parent} ({len(paths)} runs)"


def run_labels(paths_a: list[str], paths_b: list[str], runs_a, runs_b) -> dict[str, str]:
    """Each side's label, or its paths when the labels agree."""
    a = side_label(paths_a, [m for m, _ in runs_a])
    b = side_label(paths_b, [m for m, _ in runs_b])
    if a != b:
        return {"A": a, "B": b}
    return {"A": ", ".join(map(str, paths_a)), "B": ", ".join(map(str, paths_b))}


def pair_runs(
    runs_a: list[Run],
    runs_b: list[Run],
    labels: dict[str, str],
    command: str,
    rule: Rule = Rule(),
) -> tuple[dict, dict[str, pd.DataFrame], Comparison]:
    """The runs as one comparison: a manifest, tables relabelled A and B with one block per
    run, and their comparison over runs; each run's failed servers are left out."""
    sides, left_out = {}, []
    for letter, runs in (("A", runs_a), ("B", runs_b)):
        sides[letter] = []
        for n, (manifest, tables) in enumerate(runs):
            kept, doubts = without_failed_servers(manifest, tables)
            sides[letter].append((manifest, kept))
            left_out += [f"run {letter}{n + 1}: {doubt}" for doubt in doubts]
    parts, block, slot = [], 0, 0
    for letter, runs in sides.items():
        for manifest, frames in runs:
            label = manifest.get("run_id") or labels[letter]
            parts.append(_relabel(frames, letter, label, block, slot))
            block += 1
            slot += len(frames["servers"])
    frames = {name: pd.concat([p[name] for p in parts], ignore_index=True) for name in parts[0]}
    external = [
        x
        for x, runs in sides.items()
        for m, _ in runs
        if any(a["kind"] == "url" for a in m["arms"])
    ]
    result = compare(
        frames["requests"],
        frames["spans"],
        frames["servers"],
        labels,
        external=sorted(set(external)),
        audio=speaks(runs_a[0][0]),
        headline=runs_a[0][0]["scenario"]["headline"],
        rule=rule,
        unit=BETWEEN_RUNS,
    )
    result.doubts[:0] = _doubts(sides, labels) + left_out
    return _manifest(sides, labels, frames["servers"], command), frames, result


def _relabel(frames: dict, letter: str, label: str, block: int, first_slot: int) -> dict:
    """One run's rows as one block of arm `letter`: every server in block `block`, slots
    renumbered from `first_slot` in schedule order (each server keeps its own slot)."""
    keys = frames["servers"][["block", "slot"]].drop_duplicates().sort_values(["block", "slot"])
    keys = keys.assign(new_slot=range(first_slot, first_slot + len(keys)))
    out = {}
    for name, frame in frames.items():
        frame = frame.merge(keys, on=["block", "slot"])
        frame = frame.assign(
            block=block,
            slot=frame["new_slot"],
            arm=label + "/" + frame["arm"].astype(str),
            letter=letter,
            server=letter + frame["new_slot"].astype(str),
        )
        out[name] = frame.drop(columns=["new_slot"])
    return out


def _manifest(sides: dict, labels: dict[str, str], servers: pd.DataFrame, command: str) -> dict:
    manifests = [m for runs in sides.values() for m, _ in runs]
    first = manifests[0]

    def either(key: str):
        values = {str(m.get(key)) for m in manifests}
        return first.get(key) if len(values) == 1 else " vs ".join(sorted(values))

    arms = [
        {**arm, "letter": letter, "name": f"{m.get('run_id') or labels[letter]}: {arm['name']}"}
        for letter, runs in sides.items()
        for m, _ in runs
        for arm in m["arms"]
    ]
    return {
        "run_id": f"{labels['A']} vs {labels['B']}",
        "command": command,
        "scenario": first["scenario"],
        "arms": arms,
        "machine": first.get("machine"),
        "schedule": servers.sort_values(["block", "slot"])["letter"].tolist(),
        **{key: either(key) for key in ("concurrency", "requests", "duration_s", "warmup")},
        "complete": all(m.get("complete") for m in manifests),
    }


def _doubts(sides: dict, labels: dict[str, str]) -> list[str]:
    def when(runs) -> str:
        starts = [f["servers"]["start_unix"].min() for _, f in runs]
        days = sorted({time.strftime("%Y-%m-%d %H:%M", time.localtime(s)) for s in starts})
        return days[0] if len(days) == 1 else f"{days[0]} .. {days[-1]}"

    doubts = []
    counts = {x: len(runs) for x, runs in sides.items()}
    if min(counts.values()) < 2:
        doubts.append(
            f"{counts['A']} run(s) of A and {counts['B']} of B: between recorded runs the run is"
            " the unit, and a difference between two runs can be the day rather than the code;"
            " the change is descriptive, with no verdict. For a verdict give two or more runs"
            " of each side (a directory of run directories), or run both builds as the arms of"
            " one `bench run --abba --blocks 3`"
        )
    else:
        doubts.append(
            f"A's runs ({when(sides['A'])}) and B's ({when(sides['B'])}) were not interleaved:"
            " a change of the machine between the two sets counts as change"
        )
    manifests = {x: [m for m, _ in runs] for x, runs in sides.items()}
    reference = manifests["A"][0]
    differ = sorted(
        {
            f"{section + '.' if section else ''}{key}"
            for ms in manifests.values()
            for m in ms
            for section, keys in SETUP.items()
            for key in keys
            if _get(m, section, key) != _get(reference, section, key)
        }
    )
    if differ:
        doubts.append("the runs differ in setup: " + ", ".join(differ))
    for letter, ms in manifests.items():
        if not all(m.get("complete", False) for m in ms):
            doubts.append(f"a run of {labels[letter]} did not finish: partial data")
    return doubts


def _get(manifest: dict, section: str, key: str):
    if section:
        return (manifest.get(section) or {}).get(key)
    if key == "load" and "load" not in manifest:  # a run from before the open loop
        return {"mode": "closed", "concurrency": manifest.get("concurrency"), "api": "completions"}
    return manifest.get(key)
