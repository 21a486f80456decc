"""A run summarised: its manifest and tables in, its summary out, once per run: a
`Comparison` (bench run), a `Measurement` (bench measure) or a `Sweep` (bench sweep), as the
manifest's `kind` says.

`summary_json` is what summary.json holds; results.py writes it when the run ends and the
report reads it back (`from_summary_json`) rather than summarising the run again.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from harness.analysis.compare import Comparison, compare
from harness.analysis.measurement import Measurement, measure
from harness.analysis.sweep import Sweep, sweep

INCOMPLETE = "the run did not finish (interrupted or failed): partial data"
Summary = Comparison | Measurement | Sweep


def summarize(manifest: dict, frames: dict[str, pd.DataFrame]) -> Summary:
    """The run's summary: of one target, of a sweep, or arm B against arm A."""
    kind = manifest.get("kind", "compare")
    if kind == "measure":
        result = _measurement(manifest, frames)
    elif kind == "sweep":
        loads = {p["server"]: p["load"] for p in manifest["points"]}
        labels = {arm["letter"]: arm["name"] for arm in manifest["arms"]}
        result = sweep(
            frames["requests"],
            frames["servers"],
            loads,
            labels,
            manifest["axis"],
            manifest.get("goodput"),
        )
    else:
        result = _comparison(manifest, frames)
    if not manifest.get("complete", False):
        result.doubts.insert(0, INCOMPLETE)
    return result


def _measurement(manifest: dict, frames: dict[str, pd.DataFrame]) -> Measurement:
    arm = manifest["arms"][0]
    return measure(
        frames["requests"],
        frames["spans"],
        frames["servers"],
        arm["name"],
        manifest.get("load") or {},
        headline=manifest["scenario"]["headline"],
        slos_ms=manifest.get("goodput"),
        slo_attainment=manifest.get("slo_attainment", 0.99),
        external=arm["kind"] == "url",
    )


def _comparison(manifest: dict, frames: dict[str, pd.DataFrame]) -> Comparison:
    """Arm B against arm A of one run directory's tables, headline from its scenario."""
    arms = {a["letter"]: a for a in manifest["arms"]}
    result = compare(
        frames["requests"],
        frames["spans"],
        frames["servers"],
        labels={letter: arm["name"] for letter, arm in arms.items()},
        external=tuple(letter for letter, arm in arms.items() if arm["kind"] == "url"),
        headline=manifest["scenario"]["headline"],
    )
    return result


def summary_json(manifest: dict, summary: Summary) -> dict:
    """summary.json: the run's id, whether it finished, and its summary."""
    return {
        "run_id": manifest.get("run_id"),
        "complete": manifest.get("complete", False),
        **summary.to_json(),
    }


def from_summary_json(data: Mapping) -> Summary:
    """The summary summary.json holds, of the kind it says (a comparison when it says none)."""
    kind = data.get("kind")
    cls = Measurement if kind == "measure" else Sweep if kind == "sweep" else Comparison
    return cls.from_json(data)
