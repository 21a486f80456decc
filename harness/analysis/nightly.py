"""What `bench nightly` found: the step test (steps.py) over each benchmark's per-server samples
in main's first-parent order (docs/NIGHTLY.md). Every tracked figure is a cost, so an upward
step is a regression. Pure: samples in, regressions out (harness/measure/nightly.py records
them).

A regression is reported once: on the night its test became possible (a commit of its test's
window was measured by this night's run). Later nights list it as known and do not fail on it;
nothing is stored for that, since a candidate's test is fixed by the commits it was tested on.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace

from harness.analysis.steps import StepRule, find_steps
from harness.analysis.verdict import FAIL_AT

THRESHOLD = FAIL_AT  # smallest relative step flagged where asv.conf.json sets none


@dataclass(frozen=True)
class Regression:
    benchmark: str
    before: str  # the last commit at the old level (the best-supported step)
    after: str  # the first commit at the new level
    old: float  # the level before the step and after it (geometric means of commit medians)
    new: float
    since: str  # the step's first commit lies in since..until (git's range: after since)
    until: str
    known: bool = False  # reported by an earlier night: every commit of its test measured before

    @property
    def ratio(self) -> float:
        return self.new / self.old if self.old else float("inf")


@dataclass
class NightlyResult:
    machine: str
    branch: str
    measured: list[str]  # commits recorded by this run, oldest first
    failed: list[str]  # of those, commits where asv reported a failed benchmark
    regressions: list[Regression]  # every step found in the history, known ones included
    html: str | None = None
    commits: list[str] = field(default_factory=list)  # the branch, oldest first
    cluster: dict | None = None  # --cluster: its address, each commit's node, the lost commits

    @property
    def lost(self) -> list[str]:
        """Commits whose cluster task was lost (worker or node): not measured this night."""
        return [entry["commit"] for entry in (self.cluster or {}).get("lost", [])]

    @property
    def tip_failed(self) -> bool:
        return bool(self.commits) and self.commits[-1] in self.failed

    @property
    def new_regressions(self) -> list[Regression]:
        """The regressions this night reports (and fails on) for the first time."""
        return [r for r in self.regressions if not r.known]

    def to_json(self) -> dict:
        regressions = [asdict(r) | {"ratio": r.ratio} for r in self.regressions]
        extra = {"regressions": regressions, "tip_failed": self.tip_failed, "lost": self.lost}
        return asdict(self) | extra | {"new_regressions": len(self.new_regressions)}


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
    samples: dict[str, list[list[float] | None]],
    commits: list[str],
    thresholds: dict[str, float],
    tonight: set[str] | None = None,
    rule: StepRule = StepRule(),
) -> list[Regression]:
    """Upward steps in each benchmark's per-commit samples (aligned with `commits`), at least
    its threshold in size. `tonight`: the commits this night measured (None: all of them), which
    decide whether a step is new or known."""
    found = []
    for name, series in samples.items():
        threshold = replace(rule, min_step=threshold_for(name, thresholds))
        for step in find_steps(series, threshold):
            tested = {commits[i] for i in step.tested}
            known = tonight is not None and not tested & tonight
            since = commits[max(step.start - 1, 0)]
            before = commits[max(step.first - 1, 0)]
            args = (before, commits[step.first], step.old, step.new, since, commits[step.end])
            found.append(Regression(name, *args, known))
    return found
