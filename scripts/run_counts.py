"""Per server of a run, the mean of each worker count (docs/SPANS.md) and the staging-hazard
total: `python scripts/run_counts.py RUN_DIR` (used by scripts/gpu_suite.sh's evidence stage)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from engine.spans import COUNT, STAGING_HAZARDS
from harness.analysis.phases import count_means
from harness.results import load_run


def main(run: str) -> None:
    pd.set_option("display.width", 200, "display.max_columns", 20)
    _, tables = load_run(Path(run))
    spans = tables["spans"]
    means = count_means(spans, ("block", "slot", "arm"))
    print(means.pivot_table(index=["block", "slot", "arm"], columns="name", values="mean"))
    hazards = spans[(spans["kind"] == COUNT) & (spans["name"] == STAGING_HAZARDS)]
    print("staging hazards per arm:", hazards.groupby("arm")["sum"].sum().to_dict())


if __name__ == "__main__":
    main(sys.argv[1])
