"""Everything a report shows: a run's facts and raw rows, its comparison, and the calibration
and power results on record, with the doubts that qualify them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from harness.analysis.comparison import Comparison
from harness.analysis.doubts import client_limit_doubts
from harness.analysis.power_report import mismatch


@dataclass
class Evidence:
    manifest: dict
    frames: dict[str, pd.DataFrame]  # requests, spans, servers: each row with its letter
    comparison: Comparison  # the run's summary.json, or `bench compare`'s pairing
    calibration: dict | None = None  # results/calibration/latest.json
    power: dict | None = None  # results/power/<scenario>.json
    doubts: list[str] = field(default_factory=list)  # the comparison's, then the report's

    @property
    def title(self) -> str:
        return f"bench report: {self.manifest.get('run_id', '')}"


def gather(
    manifest: dict,
    frames: dict[str, pd.DataFrame],
    comparison: Comparison,
    calibration: dict | None = None,
    power: dict | None = None,
) -> Evidence:
    """Evidence from a comparison, with the calibration and power results on record."""
    evidence = Evidence(manifest, frames, comparison, calibration, power)
    evidence.doubts = [*comparison.doubts, *client_limit_doubts(comparison, calibration)]
    if power and (problems := mismatch(power, manifest)):
        evidence.doubts.append(
            "the power result on record was measured on another setup and is not quoted: "
            + "; ".join(problems)
        )
    return evidence
