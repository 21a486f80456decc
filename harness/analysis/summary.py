"""A run summarised: its manifest and tables in, its `Comparison` out, once per run.

`summary_json` is what summary.json holds; results.py writes it when the run ends and the
report reads it back (`Comparison.from_json`) rather than summarising the run again.
"""

from __future__ import annotations

import pandas as pd

from harness.analysis.compare import Comparison, compare

INCOMPLETE = "the run did not finish (interrupted or failed): partial data"


def summarize(manifest: dict, frames: dict[str, pd.DataFrame]) -> Comparison:
    """Arm B against arm A of one run directory's tables, headline from its scenario."""
    arms = {a["letter"]: a for a in manifest["arms"]}
    result = compare(
        frames["requests"],
        frames["spans"],
        frames["servers"],
        labels={letter: arm["name"] for letter, arm in arms.items()},
        external=tuple(letter for letter, arm in arms.items() if arm["kind"] == "url"),
        audio=speaks(manifest),
        headline=manifest["scenario"]["headline"],
    )
    if not manifest.get("complete", False):
        result.doubts.insert(0, INCOMPLETE)
    return result


def speaks(manifest: dict) -> bool:
    """The run drove /v1/audio/speech: its figures are audio's."""
    return (manifest["scenario"].get("load") or {}).get("api") == "speech"


def summary_json(manifest: dict, comparison: Comparison) -> dict:
    """summary.json: the run's id, whether it finished, and its comparison."""
    return {
        "run_id": manifest.get("run_id"),
        "complete": manifest.get("complete", False),
        **comparison.to_json(),
    }
