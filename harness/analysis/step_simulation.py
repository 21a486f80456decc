"""Synthetic nightly series with a known answer, judged by the nightly's own step test
(harness/analysis/steps.py; docs/NIGHTLY.md, "Finding steps"). Pure: seeded numpy draws in,
rates and a markdown table out.

A synthetic series has, for each commit, `servers` per-server log values of a cost: the
commit's level, an offset the commit's servers share (`night`: what one night of the machine
moves), and each server's own noise (`spread`). A step multiplies the cost from one commit
on, for `persist` commits, after which the series returns to its old level (a regression
reverted: the hardest case, only those commits carry it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.analysis.steps import StepRule, candidates, chains, flags, level

HISTORY = 20  # null commits before the step (the test's whole window, and more)
TAIL = 5  # commits after the step's last, back at the old level
NULL_COMMITS = 100  # a null series' commits (false flags are counted per 100 tested)


@dataclass(frozen=True)
class SeriesNoise:
    servers: int = 3  # servers (samples) per commit
    spread: float = 0.03  # sd of one server's log value about its commit's level
    night: float = 0.0  # sd of an offset shared by a commit's servers


@dataclass(frozen=True)
class NightlyRates:
    series: int
    found: float  # share of stepped series with a flag whose range holds the step's commit
    false_flags: float  # flags per 100 tested commits of null series


def simulate(
    noise: SeriesNoise, commits: int, step: float, at: int, persist: int, draws: int, rng
) -> np.ndarray:
    """[draws, commits] commit levels; commits at..at+persist-1 carry `step` (log of the
    cost's ratio)."""
    logs = rng.normal(0.0, noise.spread, (draws, commits, noise.servers))
    logs += rng.normal(0.0, noise.night, (draws, commits, 1))
    logs[:, at : at + persist] += step
    return level(logs)


def found_share(
    noise: SeriesNoise, step: float, draws: int, seed: int = 0, rule: StepRule = StepRule()
) -> float:
    """Share of series with a step of `step` (log cost ratio) persisting rule.persist commits
    that the test flags with a range holding the step's first commit."""
    rng = np.random.default_rng(seed)
    commits = HISTORY + rule.persist + TAIL
    flagged = flags(simulate(noise, commits, step, HISTORY, rule.persist, draws, rng), rule)
    hits = [
        any(start <= HISTORY <= end for start, end in chains(row, rule.persist)) for row in flagged
    ]
    return float(np.mean(hits))


def false_flags(
    noise: SeriesNoise, series: int, seed: int = 0, rule: StepRule = StepRule()
) -> float:
    """Steps flagged per 100 tested commits of `series` null series of NULL_COMMITS commits."""
    rng = np.random.default_rng(seed)
    flagged = flags(simulate(noise, NULL_COMMITS, 0.0, 0, 0, series, rng), rule)
    found = sum(len(chains(row, rule.persist)) for row in flagged)
    return 100 * found / (series * len(candidates(NULL_COMMITS, rule)))


def rates(noise: SeriesNoise, step: float, runs: int, seed: int = 0) -> NightlyRates:
    """Detection of `step` over `runs` series, false flags over runs / 20 null series."""
    nulls = max(runs // 20, 1)
    return NightlyRates(runs, found_share(noise, step, runs, seed), false_flags(noise, nulls, seed))


ROWS = (
    SeriesNoise(1, 0.03),
    SeriesNoise(2, 0.03),
    SeriesNoise(3, 0.03),
    SeriesNoise(3, 0.03, night=0.01),
    SeriesNoise(3, 0.03, night=0.02),
    SeriesNoise(3, 0.06),
    SeriesNoise(5, 0.06),
)
STEPS = {
    "+10% cost": math.log(1.10),
    "-10% throughput": -math.log(0.90),
    "+5% cost": math.log(1.05),
}


def nightly_table(runs: int) -> str:
    """The nightly detection table (markdown): for each noise, the share of series whose step
    (persisting 3 commits) is flagged, and the false flags per 100 null commits."""
    head = "| servers | server spread | night spread | " + " | ".join(STEPS)
    lines = [head + " | false flags / 100 commits |", "|--:|--:|--:|" + "--:|" * (len(STEPS) + 1)]
    for seed, noise in enumerate(ROWS):
        found = [found_share(noise, step, runs, seed) for step in STEPS.values()]
        wrong = false_flags(noise, max(runs // 20, 1), seed)
        cells = [str(noise.servers), f"{noise.spread:.0%}", f"{noise.night:.0%}"]
        cells += [f"{share:.1%}" for share in found] + [f"{wrong:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
