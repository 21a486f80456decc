"""From a run directory to its comparison: read the tables, compare, write summary.json."""

from __future__ import annotations

from pathlib import Path

from harness.compare import Comparison, compare
from harness.results import RunDir, load_run


def summarize(path: Path) -> Comparison:
    manifest, frames = load_run(path)
    arms = {a["letter"]: a for a in manifest["arms"]}
    labels = {letter: arm["name"] for letter, arm in arms.items()}
    external = tuple(letter for letter, arm in arms.items() if arm["kind"] == "url")
    result = compare(
        frames["requests"], frames["spans"], frames["servers"], labels,
        external=external, headline=manifest["scenario"]["headline"],
    )  # fmt: skip
    if not manifest.get("complete", False):
        result.doubts.insert(0, "the run did not finish (interrupted or failed): partial data")
    summary = {
        "run_id": manifest.get("run_id"),
        "complete": manifest.get("complete", False),
        **result.to_json(),
    }
    RunDir(path).write_summary(summary)
    return result
