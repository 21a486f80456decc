"""A run summarised: its manifest and tables in, its `Comparison` out, once per run.

`summary_json` is what summary.json holds; results.py writes it when the run ends and the
report reads it back (`Comparison.from_json`) rather than summarising the run again.
"""

from __future__ import annotations

import pandas as pd

from harness.analysis.compare import Comparison, compare
from harness.analysis.stats import Rule

INCOMPLETE = "the run did not finish (interrupted or failed): partial data"


def summarize(manifest: dict, frames: dict[str, pd.DataFrame]) -> Comparison:
    """Arm B against arm A of one run directory's tables, headline from its scenario, the
    equivalence margin from the run's manifest (the default for runs that name none)."""
    arms = {a["letter"]: a for a in manifest["arms"]}
    unspanned = {letter for letter, arm in arms.items() if arm["kind"] == "url"}
    unspanned |= set(manifest.get("untimed") or ())
    result = compare(
        frames["requests"],
        frames["spans"],
        frames["servers"],
        labels={letter: arm["name"] for letter, arm in arms.items()},
        external=tuple(sorted(unspanned)),
        headline=manifest["scenario"]["headline"],
        rule=Rule(margin=manifest.get("margin", Rule().margin)),
    )
    if not manifest.get("complete", False):
        result.doubts.insert(0, INCOMPLETE)
    return result


def summary_json(manifest: dict, comparison: Comparison) -> dict:
    """summary.json: the run's id, whether it finished, and its comparison."""
    return {
        "run_id": manifest.get("run_id"),
        "complete": manifest.get("complete", False),
        **comparison.to_json(),
    }
