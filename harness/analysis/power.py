"""What `bench power` found (docs/POWER.md): the harness's resolution on this machine, from an
A/A run and runs with a planted slowdown, as one `PowerReport`.

Each configuration's run is an ordinary run directory, summarised once like `bench run`'s;
`analyse` takes their tables and comparisons. A verdict rests on the block + arm model of
the per-server log values (stats.py); the real blocks (the A/A run's, and every planted
run's with its effect taken out) are the pool that synthetic runs of n blocks are drawn
from, whole (power_stats.py). They give the false-positive rate, the detection rate and
coverage of a planted +10%, and the smallest slowdown called "slower" in `POWER` of them,
each with its interval over the pool and the draws. The A/A run's own
blocks give the false alarms of real runs and the effect of a server's position in its block
(aa_run.py). The report (power_report.py) is stamped with the setup it was measured on, and a
report that quotes it checks that setup against its own run.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from engine import spans as names
from harness.analysis import phases, server_figures
from harness.analysis.aa_run import real_aa
from harness.analysis.comparison import Comparison
from harness.analysis.power_report import FigurePower, LevelResult, PowerReport
from harness.analysis.power_stats import (
    BOOTSTRAPS,
    FEW_BLOCKS,
    MIN_POOL,
    PLANTED,
    Experiments,
    Rate,
    aa_blocks,
    cv,
    null_blocks,
)
from harness.analysis.verdict import SLOWER

# figure -> higher is better: the headline throughput and the postprocess's own work
FIGURES = {"output_tok_per_s": True, phases.POSTPROCESS_WORK: False}
ITERATION = names.ITERATION
BLOCK_COUNTS = (2, 3, 5, 10, 20)  # from MIN_BLOCKS: one block gives no verdict to count
DRAWS = 2000  # synthetic runs of the pool itself behind each rate (its intervals: BOOTSTRAPS)
WIDE = 0.2  # a detection rate's interval wider than this is a doubt


@dataclass(frozen=True)
class ConfigurationRun:
    """One configuration's run directory as analysis needs it."""

    path: str
    frames: dict[str, pd.DataFrame]
    comparison: Comparison  # from its summary.json
    fraction: float = 0.0  # the planted delay, as a fraction of the A/A iteration (0: A/A)
    delay_us: int = 0


def server_values(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """[figure, letter, block, slot, value]: the power figures and the iteration time per
    server."""
    per_server = server_figures.server_summary(frames["requests"], frames["servers"])
    rows = [_long(per_server, "output_tok_per_s")]
    table = phases.phase_table(frames["spans"], phases.BY_SERVER)
    for name in (phases.POSTPROCESS_WORK, ITERATION):
        rows.append(_long(table[table["name"] == name], "ms_per_iter", name))
    return pd.concat(rows, ignore_index=True)


def _long(frame: pd.DataFrame, column: str, figure: str | None = None) -> pd.DataFrame:
    out = frame[["letter", "block", "slot", column]].rename(columns={column: "value"})
    return out.assign(figure=figure or column)[["figure", "letter", "block", "slot", "value"]]


def typical(values: pd.DataFrame, figure: str) -> float | None:
    """The median of one figure over the servers (of the A/A run: its typical value)."""
    rows = values.loc[values["figure"] == figure, "value"].dropna()
    return float(rows.median()) if len(rows) else None


def expected_ratios(
    delay_ms: float, iteration_ms: float | None, work_ms: float | None
) -> dict[str, float | None]:
    """B/A a busy-wait of `delay_ms` per iteration should give, if nothing else moves: tok/s
    scales by iteration / (iteration + delay); postprocess work grows by the delay."""
    tok = iteration_ms / (iteration_ms + delay_ms) if iteration_ms else None
    work = (work_ms + delay_ms) / work_ms if work_ms else None
    return {"output_tok_per_s": tok, phases.POSTPROCESS_WORK: work}


def analyse(
    aa: ConfigurationRun,
    planted: list[ConfigurationRun],
    facts: dict,
    blocks: int,
    seed: int = 0,
    draws: int = DRAWS,
    boots: int = BOOTSTRAPS,
) -> PowerReport:
    """The report: verdicts from the runs' comparisons, rates by resampling. `facts` are the
    report's scenario, size, machine, concurrency, requests and run_dir."""
    aa_values = server_values(aa.frames)
    aa_verdicts = {figure: c.verdict for figure, c in _changes(aa.comparison).items()}
    iteration, work = typical(aa_values, ITERATION), typical(aa_values, phases.POSTPROCESS_WORK)
    levels, planted_values = [], []
    for run in planted:
        values = server_values(run.frames)
        planted_values.append(values)
        base = values[values["letter"] == "A"]  # the run's own baseline, not the A/A run's
        expected = expected_ratios(
            run.delay_us / 1e3, typical(base, ITERATION), typical(base, phases.POSTPROCESS_WORK)
        )
        changes = {f: asdict(c) for f, c in _changes(run.comparison).items()}
        levels.append(LevelResult(run.fraction, run.delay_us, run.path, expected, changes))
    rng = np.random.default_rng(seed)
    counts = sorted({*BLOCK_COUNTS, blocks})
    figures, pool_sizes = [], []
    for figure, higher in FIGURES.items():
        pool = np.concatenate(
            [aa_blocks(_figure(aa_values, figure))]
            + [null_blocks(_figure(v, figure)) for v in planted_values]
        )
        pool_sizes.append(len(pool))
        rates = _rates(pool, counts, higher, draws, boots, rng)
        values = aa_values.loc[aa_values["figure"] == figure, "value"]
        verdict = aa_verdicts.get(figure, "-")
        sd = within_sd(pool)
        figures.append(FigurePower(figure, higher, cv(values), sd, verdict, *rates, len(pool)))
    report = PowerReport(
        **facts,
        blocks=blocks,
        iteration_ms=iteration,
        postprocess_ms=work,
        figures=figures,
        levels=levels,
        pool_size=min(pool_sizes, default=0),
        real_aa=real_aa(_figure(aa_values, "output_tok_per_s"), higher_is_better=True),
    )
    report.doubts = doubts(report)
    return report


def _rates(pool: np.ndarray, counts: list[int], higher: bool, draws: int, boots: int, rng):
    """Per block count: false positives, smallest slowdown detected, and the detection rate
    and coverage of a planted +10%, each a Rate (None with fewer than MIN_POOL blocks)."""
    out: tuple[dict, ...] = ({}, {}, {}, {})
    for n in counts:
        if len(pool) < MIN_POOL:
            for table in out:
                table[n] = None
            continue
        runs = Experiments.of(pool, n, higher, draws, rng, boots=boots)
        out[0][n] = runs.false_positive_rate()
        out[1][n] = runs.min_detectable_slowdown()
        out[2][n] = runs.detection_rate(PLANTED)
        out[3][n] = runs.coverage(PLANTED)
    return out


def within_sd(pool: np.ndarray) -> float | None:
    """A server's noise about its block's mean (log units): the pool's pooled sd."""
    if not len(pool):
        return None
    deviations = pool - pool.mean(axis=1, keepdims=True)
    return float(np.sqrt((deviations**2).sum() / (pool.size - len(pool))))


def _figure(values: pd.DataFrame, figure: str) -> pd.DataFrame:
    return values.loc[values["figure"] == figure, ["letter", "block", "slot", "value"]]


def _changes(result: Comparison) -> dict:
    by_name = {f.figure: f.change for f in result.figures}
    by_name |= {p.name: p.change for p in result.phases}
    return {figure: by_name[figure] for figure in FIGURES if figure in by_name}


def doubts(report: PowerReport) -> list[str]:
    out = []
    if report.pool_size < MIN_POOL:
        out.append(
            f"{report.pool_size} whole block(s) per figure: too few to resample, no rates;"
            " rerun with --blocks 3 or more"
        )
    elif report.pool_size < FEW_BLOCKS:
        out.append(
            f"the rates rest on {report.pool_size} whole blocks: their intervals hold the truth"
            f" less often than they say below {FEW_BLOCKS} (docs/POWER.md); rerun with more"
            " --blocks, or planted --levels, whose blocks join the pool"
        )
    n = report.quoted_blocks
    for f in report.figures:
        rate = f.detection.get(n)
        if rate and rate.low is not None and rate.high is not None and rate.high - rate.low > WIDE:
            out.append(
                f"{f.figure}: a +{PLANTED:.0%} slowdown is found in {rate.value:.0%} of {n}-block"
                f" runs, but {f.pool} real blocks pin that only to {rate.low:.0%}..{rate.high:.0%};"
                " rerun with more --blocks for a tighter figure"
            )
    found = {
        f.figure: (f.min_detectable_slowdown.get(n) or Rate(None, None, None)).value
        for f in report.figures
    }
    for level in report.levels:
        for figure, change in level.measured.items():
            ratio, needed = level.expected.get(figure), found.get(figure)
            if change["verdict"] == SLOWER or not ratio or needed is None:
                continue
            planted = 1 / ratio - 1 if FIGURES[figure] else ratio - 1
            if planted >= needed:  # big enough to be seen, yet not seen
                out.append(
                    f"planted +{level.delay_us} us (+{planted:.0%} on {figure}) was not called"
                    f" slower ({change['verdict']}) though +{needed:.0%} should be"
                )
    contrast = report.real_aa.outer_minus_inner if report.real_aa else None
    if contrast and contrast.low is not None and (contrast.low > 0 or contrast.high < 0):
        out.append(
            f"a server's position in its block moved the A/A headline: the outer servers ran"
            f" {math.expm1(contrast.mean):+.1%} against the inner ones (95% CI"
            f" {math.expm1(contrast.low):+.1%} .. {math.expm1(contrast.high):+.1%}); an even"
            " number of blocks cancels it (ABBA and BAAB in turn)"
        )
    return out
