"""Synthetic runs with a known answer, judged by the harness's own statistics
(docs/STATISTICS.md, "Checked by simulation"). Pure: seeded numpy draws in, rates out.

A synthetic run has one log value per server of a schedule: a block offset shared by the
block's servers, a steady drift through the run (slot by slot), an optional offset by a
server's position in its block, an optional offset of the run's first server (a cold start),
independent server noise, and arm B's true effect. The tests hold the verdicts' error rates
to stated bounds over thousands of such runs, and scripts/simulate_verdicts.py prints the
tables of docs/STATISTICS.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.analysis.block_model import Design, judge, schedule
from harness.analysis.stats import two_sample
from harness.analysis.student_t import t_quantile
from harness.analysis.verdict import FASTER, NO_CHANGE, NOT_ENOUGH, SLOWER, Rule, decide_many


@dataclass(frozen=True)
class Noise:
    """The noise of one figure's per-server log values (about its CV for small values)."""

    server: float = 0.05  # sd of one server's own noise
    block: float = 0.05  # sd of an offset shared by a block's servers
    drift: float = 0.01  # change per slot, steady through the run (e.g. a machine warming)
    positions: tuple[float, ...] = ()  # offset by position in the block (e.g. a U shape)
    first: float = 0.0  # offset of the run's first server alone (cold caches, compiles, clocks)
    run: float = 0.0  # sd of an offset shared by a whole run (between recorded runs)


@dataclass(frozen=True)
class Rates:
    """Shares of the synthetic runs, each verdict's and the interval's coverage of the truth."""

    runs: int
    slower: float
    faster: float
    no_change: float
    not_enough: float
    covered: float  # the interval held the true change
    # called faster or slower by the interval alone, as if one block could give a verdict
    # (block_model.MIN_BLOCKS): what one block said before
    interval_alone: float = 0.0

    @property
    def any_verdict(self) -> float:
        """Called faster or slower: with no true change, a false alarm."""
        return self.slower + self.faster


def simulate(
    letters: list[str],
    block_size: int,
    noise: Noise,
    effect: float,
    runs: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """[runs, servers] log values of a schedule; arm B's servers carry `effect` (log B/A)."""
    n = len(letters)
    slot = np.arange(n)
    block = slot // block_size
    is_b = np.array([letter == "B" for letter in letters])
    values = rng.normal(0.0, noise.server, (runs, n))
    values += rng.normal(0.0, noise.block, (runs, block.max() + 1))[:, block]
    values += noise.drift * slot
    if noise.positions:
        values += np.asarray(noise.positions, dtype=float)[slot % block_size]
    values[:, 0] += noise.first
    values += rng.normal(0.0, noise.run, (runs, 1))
    return values + effect * is_b


def rates(
    blocks: int,
    noise: Noise,
    effect: float = 0.0,
    *,
    abba: bool = True,
    runs: int = 4000,
    seed: int = 0,
    higher_is_better: bool = True,
    rule: Rule = Rule(),
) -> Rates:
    """How the harness judges `runs` synthetic runs of `blocks` blocks (the schedule
    `bench run` uses) whose arm B truly changes the figure by `effect` (log B/A)."""
    letters = schedule(blocks, abba)
    size = 4 if abba else 2
    design = Design.of(letters, size)
    rng = np.random.default_rng(seed)
    logs = simulate(letters, size, noise, effect, runs, rng)
    if design.df < 1:
        return Rates(runs, 0.0, 0.0, 0.0, 1.0, 0.0)
    _, low, high, verdicts = judge(logs, design, higher_is_better, rule)
    return _rates(verdicts, low, high, effect, decide_many(low, high, higher_is_better, rule))


def between_runs(
    runs_per_side: int,
    blocks: int,
    noise: Noise,
    effect: float = 0.0,
    *,
    by_order: bool = False,
    runs: int = 4000,
    seed: int = 0,
    higher_is_better: bool = True,
    rule: Rule = Rule(),
) -> Rates:
    """How `bench compare` judges recorded runs of `blocks` ABBA blocks each, every server of a
    run its arm's (A/A runs: the same code, each run with its own offset `noise.run`), side B
    truly changed by `effect`. The run is the unit (stats.run_change): one run a side gives no
    verdict. `by_order` judges one run a side instead as the block + arm model of their
    blocks paired by order, which treats the blocks as replicates: what bench compare did
    before, blind to the difference between the two runs."""
    letters = ["A"] * (4 * blocks)
    rng = np.random.default_rng(seed)
    sides = [
        np.stack([simulate(letters, 4, noise, 0.0, runs, rng) for _ in range(runs_per_side)], 1)
        for _ in (0, 1)
    ]  # [runs, runs_per_side, servers] each
    sides[1] = sides[1] + effect
    if by_order:
        design = Design(
            np.tile(np.arange(4 * blocks) // 4, 2), np.repeat([False, True], 4 * blocks)
        )
        logs = np.concatenate([sides[0][:, 0], sides[1][:, 0]], axis=1)
        _, low, high, verdicts = judge(logs, design, higher_is_better, rule)
        return _rates(verdicts, low, high, effect, decide_many(low, high, higher_is_better, rule))
    if runs_per_side < 2:
        return Rates(runs, 0.0, 0.0, 0.0, 0.0, 0.0)  # descriptive: no verdict, no interval
    estimate, se = two_sample(sides[0].mean(axis=2), sides[1].mean(axis=2))
    half = t_quantile(rule.level, 2 * runs_per_side - 2) * se
    low, high = estimate - half, estimate + half
    verdicts = decide_many(low, high, higher_is_better, rule)
    return _rates(verdicts, low, high, effect, verdicts)


def _rates(
    verdicts: np.ndarray, low: np.ndarray, high: np.ndarray, effect: float, alone: np.ndarray
) -> Rates:
    """The shares of `verdicts` (the harness's) and of the interval's own verdicts `alone`."""
    covered = float(np.mean((low <= effect) & (effect <= high)))
    share = {v: float(np.mean(verdicts == v)) for v in (SLOWER, FASTER, NO_CHANGE, NOT_ENOUGH)}
    said = float(np.mean(np.isin(alone, [FASTER, SLOWER])))
    counts = share[SLOWER], share[FASTER], share[NO_CHANGE], share[NOT_ENOUGH]
    return Rates(len(verdicts), *counts, covered, said)


@dataclass(frozen=True)
class AutoRates:
    """How `--blocks auto` judges synthetic runs: the final verdicts' shares and the blocks
    the runs took."""

    rates: Rates
    mean_blocks: float  # blocks a run took, on average
    at_cap: float  # share of runs that reached the cap undecided


def auto_rates(
    max_blocks: int,
    noise: Noise,
    effect: float = 0.0,
    *,
    runs: int = 4000,
    seed: int = 0,
    higher_is_better: bool = True,
    rule: Rule = Rule(),
) -> AutoRates:
    """`bench run --blocks auto --max-blocks N` on synthetic ABBA runs: each run is drawn whole
    (N blocks), then looked at after MIN_BLOCKS blocks and after each block more, every look at
    its look's sequential level (Rule.sequential over the N - MIN_BLOCKS + 1 looks); a run's
    verdict is its first look's that is not "not enough data", else its last look's."""
    from harness.analysis.block_model import MIN_BLOCKS

    looks = list(range(MIN_BLOCKS, max_blocks + 1))
    letters = schedule(max_blocks, True)
    logs = simulate(letters, 4, noise, effect, runs, np.random.default_rng(seed))
    verdicts = np.full(runs, NOT_ENOUGH, dtype=object)
    low, high = np.full(runs, np.nan), np.full(runs, np.nan)
    taken = np.full(runs, max_blocks)
    open_ = np.ones(runs, dtype=bool)
    for look, blocks in enumerate(looks, 1):
        n = 4 * blocks
        design = Design.of(letters[:n], 4)
        each = rule.sequential(len(looks), look)
        _, lo, hi, said = judge(logs[:, :n], design, higher_is_better, each)
        ends = open_ & ((said != NOT_ENOUGH) | (blocks == max_blocks))
        verdicts[ends], low[ends], high[ends] = said[ends], lo[ends], hi[ends]
        taken[ends & (said != NOT_ENOUGH)] = blocks
        open_ &= ~ends
    at_cap = float(np.mean(verdicts == NOT_ENOUGH))
    return AutoRates(_rates(verdicts, low, high, effect, verdicts), float(taken.mean()), at_cap)
