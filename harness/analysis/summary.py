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
    equivalence margin from the run's manifest (the default for runs that name none); the
    servers that failed during the run are left out (`without_failed_servers`)."""
    arms = {a["letter"]: a for a in manifest["arms"]}
    frames, left_out = without_failed_servers(manifest, frames)
    unspanned = {letter for letter, arm in arms.items() if arm["kind"] == "url"}
    unspanned |= set(manifest.get("untimed") or ())
    result = compare(
        frames["requests"],
        frames["spans"],
        frames["servers"],
        labels={letter: arm["name"] for letter, arm in arms.items()},
        external=tuple(sorted(unspanned)),
        audio=speaks(manifest),
        headline=manifest["scenario"]["headline"],
        rule=Rule(margin=manifest.get("margin", Rule().margin)),
    )
    result.doubts[:0] = left_out
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


def without_failed_servers(
    manifest: dict, frames: dict[str, pd.DataFrame]
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The tables without the requests and spans of the servers the manifest names in
    `failed_servers` (one that died or stalled under load, or most of whose requests failed:
    its figures would describe the fault, not the arm), and a doubt naming them. Their rows in
    the servers table stay, with the error that says what happened."""
    failed = list(manifest.get("failed_servers") or {})
    if not failed:
        return frames, []
    kept = {
        name: frame if name == "servers" else frame[~frame["server"].isin(failed)]
        for name, frame in frames.items()
    }
    noun = "servers" if len(failed) > 1 else "server"
    return kept, [f"{noun} {', '.join(failed)} failed during the run: left out of the comparison"]
