"""What `bench power` found (docs/POWER.md): the harness's resolution on this machine, from an
A/A run and runs with a planted slowdown, as one `PowerReport`.

Each configuration's run is an ordinary run directory, summarised once like `bench run`'s;
`analyse` takes their tables and comparisons. The verdict of a `bench run` rests on the
per-block log ratio r = log(B/A); its null distribution comes from the runs (the A/A ratios,
and each planted run's ratios less their mean), and synthetic experiments of n blocks drawn
from it (power_stats.py) give the false-positive rate and the smallest slowdown called
"slower" in `POWER` of them, for n blocks.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from engine import spans as names
from harness.analysis import metrics, phases
from harness.analysis.compare import Comparison
from harness.analysis.power_stats import (
    MIN_POOL,
    cv,
    false_positive_rate,
    min_detectable_slowdown,
    null_pool,
    resample,
)
from harness.analysis.stats import SLOWER, block_log_ratios

# figure -> higher is better: the headline throughput and the postprocess's own work
FIGURES = {"output_tok_per_s": True, phases.POSTPROCESS_WORK: False}
ITERATION = names.ITERATION
BLOCK_COUNTS = (2, 3, 5, 10, 20)
DRAWS = 2000


@dataclass
class FigurePower:
    figure: str
    higher_is_better: bool
    cv: float | None  # spread of the per-server values across the A/A run's servers
    block_sd: float | None  # spread of the per-block log ratio (A/A and centred planted runs)
    aa_verdict: str  # the verdict of the real A/A run
    false_positive_rate: dict[int, float | None]  # blocks -> share called faster or slower
    min_detectable_slowdown: dict[int, float | None]  # blocks -> +x time per unit of work


@dataclass
class LevelResult:
    fraction: float
    delay_us: int
    run_dir: str
    expected: dict[str, float | None]  # figure -> B/A the delay should give on this run's A
    measured: dict[str, dict]  # figure -> the run's Change (ratio, low, high, verdict, ...)


@dataclass
class PowerReport:
    scenario: str
    size: str
    machine: dict
    blocks: int
    concurrency: int
    requests: int
    iteration_ms: float | None
    postprocess_ms: float | None
    figures: list[FigurePower]
    levels: list[LevelResult]
    run_dir: str
    pool_size: int = 0  # null block ratios the rates rest on (the smallest over the figures)
    doubts: list[str] = field(default_factory=list)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    @property
    def quoted_blocks(self) -> int:
        """The block count the headline numbers are for (a paired interval needs 2)."""
        return max(self.blocks, 2)

    def to_json(self) -> dict:
        n = self.quoted_blocks
        return {
            "scenario": self.scenario,
            "size": self.size,
            "machine": self.machine,
            "blocks": self.blocks,
            "false_positive_rate": {f.figure: f.false_positive_rate[n] for f in self.figures},
            "min_detectable_slowdown": {
                f.figure: f.min_detectable_slowdown[n] for f in self.figures
            },
            "noise": {f.figure: f.cv for f in self.figures},
            "levels": [asdict(level) for level in self.levels],
            "created": self.created,
            "quoted_blocks": n,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "iteration_ms": self.iteration_ms,
            "postprocess_ms": self.postprocess_ms,
            "figures": [asdict(f) for f in self.figures],
            "run_dir": self.run_dir,
            "pool_size": self.pool_size,
            "doubts": self.doubts,
        }


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
    per_server = metrics.server_summary(frames["requests"], frames["servers"])
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
    counts = sorted({*BLOCK_COUNTS, max(blocks, 2)})
    figures, pool_sizes = [], []
    for figure, higher in FIGURES.items():
        aa_ratios = _ratios(aa_values, figure)
        pool = null_pool(aa_ratios, [_ratios(v, figure) for v in planted_values])
        pool_sizes.append(len(pool))
        fpr, mde = {}, {}
        for n in counts:
            sample = resample(pool, n, draws, rng) if len(pool) else None
            fpr[n] = None if sample is None else false_positive_rate(sample, higher)
            mde[n] = None if sample is None else min_detectable_slowdown(sample, higher)
        values = aa_values.loc[aa_values["figure"] == figure, "value"]
        spread = float(np.std(pool, ddof=1)) if len(pool) > 1 else None
        verdict = aa_verdicts.get(figure, "-")
        figures.append(FigurePower(figure, higher, cv(values), spread, verdict, fpr, mde))
    report = PowerReport(
        **facts,
        blocks=blocks,
        iteration_ms=iteration,
        postprocess_ms=work,
        figures=figures,
        levels=levels,
        pool_size=min(pool_sizes, default=0),
    )
    report.doubts = doubts(report)
    return report


def _ratios(values: pd.DataFrame, figure: str) -> np.ndarray:
    rows = values.loc[values["figure"] == figure, ["letter", "block", "value"]]
    return block_log_ratios(rows, "A", "B").to_numpy(float)


def _changes(result: Comparison) -> dict:
    by_name = {f.figure: f.change for f in result.figures}
    by_name |= {p.name: p.change for p in result.phases}
    return {figure: by_name[figure] for figure in FIGURES if figure in by_name}


def doubts(report: PowerReport) -> list[str]:
    out = []
    if report.pool_size < MIN_POOL:
        out.append(
            f"{report.pool_size} null block ratios per figure: the rates assume normal noise of"
            " their spread and are rough; rerun with --blocks 3 or more"
        )
    found = {f.figure: f.min_detectable_slowdown[report.quoted_blocks] for f in report.figures}
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
    return out
