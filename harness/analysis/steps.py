"""The nightly's step test (docs/NIGHTLY.md, "Finding steps"): where a benchmark's series of
commits stepped up, from each commit's per-server samples. Pure functions.

A commit's level is the median of the logs of its samples (its servers' values; asv keeps
them with `--record-samples`). Between commits the unit is the commit, as between recorded
runs it is the run (docs/STATISTICS.md): whatever a night shares (the machine's state, the
hour) moves every server of that commit together, so the servers of one commit are not
replicates of a step. A candidate step at commit k is judged by the harness's interval of
recorded runs (stats.two_sample, a pooled t-interval over commit levels) between the `window`
commits before k and the `persist` commits from k on, at `1 - 2 * alpha`, through the same
verdict rule as `bench run` (verdict.decide_many): "slower" (the cost went up), at least
`min_step` by its estimate, and every one of the `persist` commits above the old level.

Each candidate is tested once its `persist` commits exist, and its window never changes after
that: a flag is fixed by the commits it was tested on. Flagged candidates less than `persist`
apart are one step, named once by its range (`chains`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.analysis.stats import two_sample
from harness.analysis.student_t import t_quantile
from harness.analysis.verdict import FAIL_AT, SLOWER, Rule, decide_many

PERSIST = 3  # commits at the new level a step must hold before it is tested
WINDOW = 15  # commits before the candidate that give the old level
MIN_BEFORE = 5  # fewer commits before a candidate than this: not tested (a new series)
ALPHA = 0.0025  # one-sided error rate of each candidate's test


@dataclass(frozen=True)
class StepRule:
    """How a step is told from a series' noise."""

    persist: int = PERSIST
    window: int = WINDOW
    min_before: int = MIN_BEFORE
    alpha: float = ALPHA
    min_step: float = FAIL_AT  # a step smaller than this (relative) is not flagged

    @property
    def rule(self) -> Rule:
        """The interval's rule: two-sided at 1 - 2 alpha, so each side errs at alpha."""
        return Rule(level=1 - 2 * self.alpha)


@dataclass(frozen=True)
class Step:
    """A step up in one series; indices are positions in the series (its commits' order)."""

    first: int  # the first commit at the new level (the best-supported candidate)
    start: int  # the chain's first and last flagged candidates: the step lies in start..end
    end: int
    old: float  # the old level and the new (geometric means of the commits' medians)
    new: float
    tested: tuple[int, ...]  # the commits the chain's first candidate was tested on

    @property
    def ratio(self) -> float:
        return self.new / self.old


def level(logs: np.ndarray) -> np.ndarray:
    """A commit's level from its samples' logs (the last axis): their median, as asv's value."""
    return np.median(logs, axis=-1)


def levels(samples: Sequence[Sequence[float] | None]) -> np.ndarray:
    """Each commit's level: the median of the logs of its finite, positive samples; NaN for a
    commit without any (not measured, or its benchmark failed)."""
    out = np.full(len(samples), np.nan)
    for i, values in enumerate(samples):
        x = np.asarray(values if values is not None else [], dtype=float)
        x = x[np.isfinite(x) & (x > 0)]
        if len(x):
            out[i] = float(level(np.log(x)))
    return out


def step_up(
    before: np.ndarray, after: np.ndarray, rule: StepRule = StepRule()
) -> tuple[np.ndarray, np.ndarray]:
    """Whether the commit levels `after` ([..., persist]) stepped up from `before` ([...,
    commits]), along the last axis; and the step's size (log new / old)."""
    effect, se = two_sample(before, after)
    half = t_quantile(rule.rule.level, before.shape[-1] + after.shape[-1] - 2) * se
    verdict = decide_many(effect - half, effect + half, False, rule.rule)
    persists = (after > before.mean(axis=-1, keepdims=True)).all(axis=-1)
    large = effect >= math.log1p(rule.min_step)
    return (verdict == SLOWER) & persists & large, effect


def candidates(count: int, rule: StepRule = StepRule()) -> range:
    """The positions of a series of `count` commits that can be tested: min_before commits
    before them and persist commits from them on."""
    return range(rule.min_before, count - rule.persist + 1)


def window(k: int, rule: StepRule = StepRule()) -> tuple[int, int, int]:
    """Candidate k's test: the old level from commits lo..k-1, the new from k..hi-1."""
    return max(0, k - rule.window), k, k + rule.persist


def flags(levels: np.ndarray, rule: StepRule = StepRule()) -> np.ndarray:
    """[..., commits] levels (no NaN) -> [..., commits] whether each candidate is flagged
    (False where a commit cannot be tested)."""
    out = np.zeros(levels.shape, dtype=bool)
    for k in candidates(levels.shape[-1], rule):
        lo, mid, hi = window(k, rule)
        out[..., k] = step_up(levels[..., lo:mid], levels[..., mid:hi], rule)[0]
    return out


def chains(flagged: np.ndarray, persist: int = PERSIST) -> list[tuple[int, int]]:
    """Runs of flagged candidates (one series' [commits] flags) less than `persist` apart: one
    step each, (start, end). A step flags its neighbours too (their windows hold part of it)."""
    out: list[tuple[int, int]] = []
    for k in np.flatnonzero(flagged):
        if out and k - out[-1][1] < persist:
            out[-1] = (out[-1][0], int(k))
        else:
            out.append((int(k), int(k)))
    return out


def find_steps(
    samples: Sequence[Sequence[float] | None], rule: StepRule = StepRule()
) -> list[Step]:
    """The steps up in one series of per-commit samples. Commits without samples are skipped
    (the windows count commits with data); positions returned are the series'."""
    found = levels(samples)
    where = np.flatnonzero(np.isfinite(found))
    y = found[where]
    out = []
    for start, end in chains(flags(y, rule), rule.persist):
        sizes = {k: _size(y, k, rule) for k in range(start, end + 1)}
        best = max(sizes, key=lambda k: sizes[k][0])
        _, old, new = sizes[best]
        lo, _, hi = window(start, rule)
        tested = tuple(int(i) for i in where[lo:hi])
        first, last = int(where[start]), int(where[end])
        out.append(Step(int(where[best]), first, last, old, new, tested))
    return out


def _size(y: np.ndarray, k: int, rule: StepRule) -> tuple[float, float, float]:
    """Candidate k's t statistic and its old and new levels."""
    lo, mid, hi = window(k, rule)
    effect, se = two_sample(y[lo:mid], y[mid:hi])
    t = float(effect / se) if se > 0 else math.inf * float(np.sign(effect))
    return t, math.exp(float(y[lo:mid].mean())), math.exp(float(y[mid:hi].mean()))
