"""What `bench nightly` found: asv's step detection over each benchmark's series in main's
first-parent order (docs/NIGHTLY.md). Every tracked figure is a cost, so an upward step is a
regression. Pure: series in, regressions out (harness/measure/nightly.py records them).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

THRESHOLD = 0.05  # relative step asv reports when asv.conf.json sets none for a benchmark


@dataclass(frozen=True)
class Regression:
    benchmark: str
    before: str  # the last commit at the old level
    after: str  # the first commit at the new level (before's child: a one-commit step)
    old: float  # the level before the step
    new: float  # the best value after it

    @property
    def ratio(self) -> float:
        return self.new / self.old if self.old else float("inf")


@dataclass
class NightlyResult:
    machine: str
    branch: str
    measured: list[str]  # commits recorded by this run, oldest first
    failed: list[str]  # of those, commits where asv reported a failed benchmark
    regressions: list[Regression]
    html: str | None = None
    commits: list[str] = field(default_factory=list)  # the branch, oldest first

    @property
    def tip_failed(self) -> bool:
        return bool(self.commits) and self.commits[-1] in self.failed

    def to_json(self) -> dict:
        regressions = [asdict(r) | {"ratio": r.ratio} for r in self.regressions]
        return asdict(self) | {"regressions": regressions, "tip_failed": self.tip_failed}


def to_measure(commits: list[str], measured: set[str], since: list[str] | None) -> list[str]:
    """`since` (the commits after REV) when given, else the commits not yet measured."""
    if since is not None:
        wanted = set(since)
        return [c for c in commits if c in wanted]
    return [c for c in commits if c not in measured]


def threshold_for(name: str, thresholds: dict[str, float]) -> float:
    """asv.conf.json's regressions_thresholds: the largest of those whose regex matches."""
    matched = [value for regex, value in thresholds.items() if re.match(regex, name)]
    return max(matched, default=THRESHOLD)


def find_regressions(
    values: dict[str, list[float | None]], commits: list[str], thresholds: dict[str, float]
) -> list[Regression]:
    """Upward steps (every figure is a cost) that asv's step detection keeps."""
    from asv.step_detect import detect_regressions, detect_steps

    found = []
    for name, ys in values.items():
        if sum(y is not None for y in ys) < 2:
            continue
        _, _, jumps = detect_regressions(detect_steps(ys), threshold_for(name, thresholds))
        for before, after, old, new in jumps or []:
            found.append(Regression(name, commits[before], commits[after], old, new))
    return found
