"""What `bench power` found (docs/POWER.md): the harness's resolution on this machine, from an
A/A run and runs with a planted slowdown, as one `PowerReport`.

Each configuration's run is an ordinary run directory, summarised once like `bench run`'s;
`analyse` takes their tables and comparisons. A verdict rests on the block + arm model of
the per-server log values (stats.py); the real blocks (the A/A run's, and every planted
run's with its effect taken out) are the pool that synthetic runs of n blocks are drawn
from, whole (power_stats.py). They give the false-positive rate, the detection rate and
coverage of a planted +10%, and the smallest slowdown called "slower" in `POWER` of them,
each with its interval over the pool and the draws. The A/A run's own
blocks give the false alarms of real runs and the effect of a server's position in its block.
The report is stamped with the setup it was measured on (`stamp`), and a report that quotes
it checks that setup against its own run (`mismatch`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from engine import spans as names
from harness.analysis import metrics, phases
from harness.analysis.compare import Comparison
from harness.analysis.power_stats import (
    BLOCK_SIZE,
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
from harness.analysis.stats import (
    FASTER,
    MIN_BLOCKS,
    SLOWER,
    Rule,
    paired_change,
    t_quantile,
)

# figure -> higher is better: the headline throughput and the postprocess's own work
FIGURES = {"output_tok_per_s": True, phases.POSTPROCESS_WORK: False}
ITERATION = names.ITERATION
BLOCK_COUNTS = (2, 3, 5, 10, 20)  # from MIN_BLOCKS: one block gives no verdict to count
DRAWS = 2000  # synthetic runs of the pool itself behind each rate (its intervals: BOOTSTRAPS)
MACHINE_KEYS = ("host", "cpu", "cpus", "gpu")  # what makes two machines the same for noise
WIDE = 0.2  # a detection rate's interval wider than this is a doubt


@dataclass
class FigurePower:
    figure: str
    higher_is_better: bool
    cv: float | None  # spread of the per-server values across the A/A run's servers
    noise_sd: float | None  # a server's noise within its block (log units), the pool's
    aa_verdict: str  # the verdict of the real A/A run
    # blocks -> the rate and its interval (None without a pool)
    false_positive_rate: dict[int, Rate | None]  # share called faster or slower
    min_detectable_slowdown: dict[int, Rate | None]  # +x time per unit of work
    detection: dict[int, Rate | None]  # share of a planted +10% called slower
    coverage: dict[int, Rate | None]  # share of intervals holding that +10%
    pool: int = 0  # whole blocks the rates rest on


@dataclass
class LevelResult:
    fraction: float
    delay_us: int
    run_dir: str
    expected: dict[str, float | None]  # figure -> B/A the delay should give on this run's A
    measured: dict[str, dict]  # figure -> the run's Change (ratio, low, high, verdict, ...)


@dataclass
class PositionEffect:
    """One position of the A/A blocks: how far its servers sat from their block's mean."""

    position: int  # 0..3 within the block
    letters: str  # the arm at this position in each block, e.g. "ABAB"
    mean: float | None  # mean log deviation from the block mean (about a relative offset)
    low: float | None  # t-interval over the blocks (level 0.95)
    high: float | None


@dataclass
class RealAA:
    """The headline figure over the real A/A blocks: false alarms of runs of k consecutive
    blocks (the blocks split into disjoint groups of k), and position effects."""

    blocks: int
    alarms: dict[int, list[int]]  # k -> [runs called faster or slower, runs of k blocks]
    positions: list[PositionEffect]
    outer_minus_inner: PositionEffect | None  # positions 0 and 3 against 1 and 2


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
    pool_size: int = 0  # whole blocks the rates rest on (the smallest over the figures)
    real_aa: RealAA | None = None
    doubts: list[str] = field(default_factory=list)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    @property
    def quoted_blocks(self) -> int:
        """The block count the headline numbers are for."""
        return self.blocks

    def stamp(self) -> dict:
        """What the figures hold for: a report of another setup must not quote them."""
        machine = {key: self.machine.get(key) for key in MACHINE_KEYS}
        return {
            "scenario": self.scenario,
            "size": self.size,
            "machine": machine,
            "concurrency": self.concurrency,
            "blocks": self.blocks,
        }

    def to_json(self) -> dict:
        n = self.quoted_blocks
        return {
            "stamp": self.stamp(),
            "scenario": self.scenario,
            "size": self.size,
            "machine": self.machine,
            "blocks": self.blocks,
            "false_positive_rate": {
                f.figure: _plain(f.false_positive_rate, n) for f in self.figures
            },
            "min_detectable_slowdown": {
                f.figure: _plain(f.min_detectable_slowdown, n) for f in self.figures
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
            "real_aa": asdict(self.real_aa) if self.real_aa else None,
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


def _plain(rates: dict[int, Rate | None], n: int) -> float | None:
    rate = rates.get(n)
    return rate.value if rate else None


def _figure(values: pd.DataFrame, figure: str) -> pd.DataFrame:
    return values.loc[values["figure"] == figure, ["letter", "block", "slot", "value"]]


def _changes(result: Comparison) -> dict:
    by_name = {f.figure: f.change for f in result.figures}
    by_name |= {p.name: p.change for p in result.phases}
    return {figure: by_name[figure] for figure in FIGURES if figure in by_name}


def real_aa(values: pd.DataFrame, higher_is_better: bool, rule: Rule = Rule()) -> RealAA | None:
    """The real A/A blocks of one figure (columns letter, block, slot, value): how often runs
    of k consecutive blocks raise a false alarm (k from MIN_BLOCKS: one block gives no
    verdict), and where in a block its servers sat."""
    values = values[values["value"] > 0]
    blocks = sorted(values["block"].unique())
    if not blocks:
        return None
    alarms = {}
    for k in range(MIN_BLOCKS, len(blocks) + 1):
        groups = [blocks[i : i + k] for i in range(0, len(blocks) - k + 1, k)]
        found = [
            paired_change(values[values["block"].isin(g)], "A", "B", higher_is_better, rule)
            for g in groups
        ]
        alarms[k] = [sum(c.verdict in (FASTER, SLOWER) for c in found), len(found)]
    logs = values.assign(log=np.log(values["value"].astype(float)))
    logs["deviation"] = logs["log"] - logs.groupby("block")["log"].transform("mean")
    logs["position"] = logs["slot"] - logs.groupby("block")["slot"].transform("min")
    positions = []
    for position, rows in logs.groupby("position", sort=True):
        order = "".join(rows.sort_values("block")["letter"])
        positions.append(_mean_interval(rows["deviation"], int(position), order))
    outer = logs["position"].isin([0, BLOCK_SIZE - 1])
    by_block = logs[outer].groupby("block")["deviation"].mean()
    by_block -= logs[~outer].groupby("block")["deviation"].mean()
    contrast = _mean_interval(by_block.dropna(), -1, "outer - inner")
    return RealAA(len(blocks), alarms, positions, contrast)


def _mean_interval(deviations: pd.Series, position: int, letters: str) -> PositionEffect:
    x = deviations.to_numpy(float)
    if len(x) < 2:
        mean = float(x.mean()) if len(x) else None
        return PositionEffect(position, letters, mean, None, None)
    half = t_quantile(0.95, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return PositionEffect(position, letters, float(x.mean()), x.mean() - half, x.mean() + half)


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


def mismatch(power: dict, manifest: dict) -> list[str]:
    """How the setup a power result was measured on differs from a run's: scenario, size,
    concurrency and machine (MACHINE_KEYS). Empty when they agree; a result without a stamp
    (written before stamps) is a mismatch. The block count is not: the result holds its rates
    for several block counts (`rates_for`)."""
    stamp = power.get("stamp")
    if not isinstance(stamp, dict):
        return ["it carries no stamp of the setup it was measured on"]
    scenario = manifest.get("scenario") or {}
    machine = manifest.get("machine") or {}
    ours = {
        "scenario": scenario.get("name"),
        "size": scenario.get("size"),
        "concurrency": manifest.get("concurrency"),
    }
    out = [
        f"{key} {stamp.get(key)} (this run: {value})"
        for key, value in ours.items()
        if stamp.get(key) != value
    ]
    theirs = stamp.get("machine") or {}
    out += [
        f"machine {key} {theirs.get(key)} (this run: {machine.get(key)})"
        for key in MACHINE_KEYS
        if theirs.get(key) != machine.get(key)
    ]
    return out


def rates_for(power: dict, figure: str, blocks: int) -> dict[str, float | None] | None:
    """A power result's rates for one figure at a block count: false positives, smallest
    slowdown detected, detection and coverage of +10% (each its value; `<key>_low` and
    `<key>_high` its interval where the result has one); None when it has none for them."""
    entry = next((f for f in power.get("figures") or [] if f.get("figure") == figure), None)
    keys = ("false_positive_rate", "min_detectable_slowdown", "detection", "coverage")
    if entry is None or str(blocks) not in {str(k) for k in entry.get(keys[0]) or {}}:
        return None
    out: dict[str, float | None] = {}
    for key in keys:
        found = {str(k): v for k, v in (entry.get(key) or {}).items()}.get(str(blocks))
        rate = found if isinstance(found, dict) else {"value": found}  # before intervals: plain
        out |= {key: rate.get("value"), f"{key}_low": rate.get("low")}
        out[f"{key}_high"] = rate.get("high")
    return out
