"""`bench power`: the harness's own resolution on this machine (docs/POWER.md).

Measuring: one A/A run of ABBA blocks, then one run per level whose arm B carries a planted,
known slowdown (`engine.planted_delay_us`, a busy-wait inside the worker's postprocess) sized
as a fraction of the A/A iteration time. Each configuration is an ordinary run directory
under results/power/<run>/, executed by the runner and judged by `summarize`, like `bench run`.

Statistics (pure functions, below the measuring part): the verdict of a `bench run` rests on
the per-block log ratio r = log(B/A). Its null distribution is taken from the runs (the A/A
ratios, and each planted run's ratios less their mean); synthetic experiments of n blocks
draw n ratios from it with random signs (A and B are exchangeable under the null), add a
known slowdown, and take the harness's own interval and verdict (stats.t_quantile,
stats.decide). The share of "faster"/"slower" verdicts with no slowdown is the false-positive
rate; the smallest slowdown called "slower" in `POWER` of the experiments is the minimum
detectable slowdown for n blocks.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from engine.config import Scenario, parse_overrides
from harness import metrics, phases
from harness.arms import resolve
from harness.errors import BenchError
from harness.loadgen import build_requests
from harness.results import RunDir, load_run, machine
from harness.runner import RunPlan, SlotStatus, execute
from harness.stats import FASTER, SLOWER, Rule, block_log_ratios, decide, t_quantile
from harness.summarize import summarize

# figure -> higher is better: the headline throughput and the postprocess's own work
FIGURES = {"output_tok_per_s": True, phases.POSTPROCESS_WORK: False}
ITERATION = "worker.iter_total"
POWER = 0.8  # a slowdown is "detectable" when this share of experiments call it slower
BLOCK_COUNTS = (2, 3, 5, 10, 20)
DRAWS = 2000
MIN_POOL = 8  # null ratios needed to resample them rather than use a normal of their spread
LARGEST = 10.0  # slowdowns searched up to +1000% time


@dataclass(frozen=True)
class PowerPlan:
    scenario: Scenario
    concurrency: int
    blocks: int
    requests: int
    warmup: int
    levels: tuple[float, ...]  # planted delays as fractions of the A/A iteration time
    ref: str = "HEAD"  # the code both arms run (a git ref, or "worktree")
    period: int = 100
    seed: int = 0
    draws: int = DRAWS  # synthetic experiments per block count


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


# --- measuring ---------------------------------------------------------------------------


def run_configuration(
    plan: PowerPlan, path: Path, delay_us: int, show: Callable[[SlotStatus], None]
) -> bool:
    """One ABBA run: A = the plan's ref, B = the same code with `delay_us` planted (0: A/A)."""
    from engine.models import vocab_size  # torch: not at `bench` start-up

    a = resolve("A", "A", plan.ref)
    b = replace(a, letter="B", name="B")
    if delay_us:
        spec = f"engine.planted_delay_us={delay_us}"
        b = replace(b, kind="overrides", spec=spec, overrides=parse_overrides(spec))
    arms = (a, b)
    letters = ["A", "B", "B", "A"] * plan.blocks
    load = plan.scenario.load
    run = RunPlan(
        scenario=plan.scenario,
        arms={a.letter: a for a in arms},
        letters=letters,
        block_size=4,
        concurrency=plan.concurrency,
        requests=build_requests(load, vocab_size(plan.scenario.model), plan.warmup + plan.requests),
        warmup=plan.warmup,
        period=plan.period,
    )
    rundir = RunDir(path)
    rundir.write_manifest({
        "run_id": f"power-{path.parent.name}-{path.name}", "command": "bench power",
        "scenario": plan.scenario.to_dict(), "arms": [a.manifest() for a in arms],
        "aa_check": not delay_us, "schedule": letters, "concurrency": plan.concurrency,
        "requests": plan.requests, "duration_s": None, "warmup": plan.warmup,
        "period": plan.period, "machine": machine(), "complete": False,
    })  # fmt: skip
    complete = execute(run, rundir, show)
    rundir.update_manifest(complete=complete)
    return complete


def measure(plan: PowerPlan, root: Path, show: Callable[[SlotStatus], None]) -> PowerReport:
    """Run the A/A configuration, then one per level, then analyse them all. `show` sees every
    slot numbered across the whole power run, its arm prefixed by the configuration."""
    slots, total = 4 * plan.blocks, 4 * plan.blocks * (1 + len(plan.levels))

    def run(path: Path, delay_us: int, number: int) -> None:
        name = f"+{delay_us} us" if delay_us else "A/A"

        def shown(s: SlotStatus) -> None:
            show(replace(s, slot=number * slots + s.slot, slots=total, arm=f"{name}: {s.arm}"))

        if not run_configuration(plan, path, delay_us, shown):
            raise BenchError(f"the {name} run did not finish; partial results in {path}")

    run(root / "aa", 0, 0)
    iteration = typical(server_values(root / "aa"), ITERATION)
    if iteration is None:
        raise BenchError(f"no {ITERATION} spans in {root / 'aa'}; see its logs/")
    planted = {}
    for number, fraction in enumerate(plan.levels, start=1):
        delay_us = max(1, round(fraction * iteration * 1e3))
        path = root / f"delay-{delay_us}us"
        run(path, delay_us, number)
        planted[(fraction, delay_us)] = path
    return analyse(plan, root, planted)


def server_values(path: Path) -> pd.DataFrame:
    """[figure, arm, block, slot, value]: the power figures and the iteration time per server
    (arm is the letter: power runs name their arms A and B)."""
    _, frames = load_run(path)
    per_server = metrics.server_summary(frames["requests"], frames["servers"])
    rows = [_long(per_server, "output_tok_per_s")]
    table = phases.phase_table(frames["spans"], phases.SERVER)
    for name in (phases.POSTPROCESS_WORK, ITERATION):
        rows.append(_long(table[table["name"] == name], "ms_per_iter", name))
    return pd.concat(rows, ignore_index=True)


def _long(frame: pd.DataFrame, column: str, figure: str | None = None) -> pd.DataFrame:
    out = frame[["arm", "block", "slot", column]].rename(columns={column: "value"})
    return out.assign(figure=figure or column)[["figure", "arm", "block", "slot", "value"]]


def typical(values: pd.DataFrame, figure: str) -> float | None:
    """The median of one figure over the servers (of the A/A run: its typical value)."""
    rows = values.loc[values["figure"] == figure, "value"].dropna()
    return float(rows.median()) if len(rows) else None


def analyse(plan: PowerPlan, root: Path, planted: dict[tuple[float, int], Path]) -> PowerReport:
    """The report from the run directories: verdicts by summarize, power by resampling."""
    aa_values = server_values(root / "aa")
    aa_verdicts = _verdicts(summarize(root / "aa"))
    iteration, work = typical(aa_values, ITERATION), typical(aa_values, phases.POSTPROCESS_WORK)
    levels, planted_values = [], []
    for (fraction, delay_us), path in planted.items():
        values = server_values(path)
        planted_values.append(values)
        base = values[values["arm"] == "A"]  # the run's own baseline, not the A/A run's
        expected = expected_ratios(
            delay_us / 1e3, typical(base, ITERATION), typical(base, phases.POSTPROCESS_WORK)
        )
        changes = {f: asdict(c) for f, c in _changes(summarize(path)).items()}
        levels.append(LevelResult(fraction, delay_us, str(path), expected, changes))
    rng = np.random.default_rng(plan.seed)
    counts = sorted({*BLOCK_COUNTS, max(plan.blocks, 2)})
    figures, pool_sizes = [], []
    for figure, higher in FIGURES.items():
        aa_ratios = _ratios(aa_values, figure)
        pool = null_pool(aa_ratios, [_ratios(v, figure) for v in planted_values])
        pool_sizes.append(len(pool))
        fpr, mde = {}, {}
        for n in counts:
            draws = resample(pool, n, plan.draws, rng) if len(pool) else None
            fpr[n] = None if draws is None else false_positive_rate(draws, higher)
            mde[n] = None if draws is None else min_detectable_slowdown(draws, higher)
        values = aa_values.loc[aa_values["figure"] == figure, "value"]
        spread = float(np.std(pool, ddof=1)) if len(pool) > 1 else None
        figures.append(
            FigurePower(figure, higher, cv(values), spread, aa_verdicts.get(figure, "-"), fpr, mde)
        )
    report = PowerReport(
        plan.scenario.name, plan.scenario.size, machine(), plan.blocks, plan.concurrency,
        plan.requests, iteration, work, figures, levels, str(root),
    )  # fmt: skip
    report.pool_size = min(pool_sizes, default=0)
    report.doubts = doubts(report)
    return report


def _ratios(values: pd.DataFrame, figure: str) -> np.ndarray:
    rows = values.loc[values["figure"] == figure, ["arm", "block", "value"]]
    return block_log_ratios(rows, "A", "B").to_numpy(float)


def _changes(result) -> dict:
    by_name = {f.figure: f.change for f in result.figures} | {
        p.name: p.change for p in result.phases
    }
    return {figure: by_name[figure] for figure in FIGURES if figure in by_name}


def _verdicts(result) -> dict[str, str]:
    return {figure: change.verdict for figure, change in _changes(result).items()}


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


# --- statistics (pure) -------------------------------------------------------------------


def cv(values: Sequence[float] | pd.Series) -> float | None:
    """Coefficient of variation: sample standard deviation over mean (None for < 2 values)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2 or x.mean() == 0:
        return None
    return float(x.std(ddof=1) / x.mean())


def expected_ratios(
    delay_ms: float, iteration_ms: float | None, work_ms: float | None
) -> dict[str, float | None]:
    """B/A a busy-wait of `delay_ms` per iteration should give, if nothing else moves: tok/s
    scales by iteration / (iteration + delay); postprocess work grows by the delay."""
    tok = iteration_ms / (iteration_ms + delay_ms) if iteration_ms else None
    work = (work_ms + delay_ms) / work_ms if work_ms else None
    return {"output_tok_per_s": tok, phases.POSTPROCESS_WORK: work}


def null_pool(aa: np.ndarray, planted: Sequence[np.ndarray] = ()) -> np.ndarray:
    """Per-block log ratios with no effect in them: the A/A ratios as they are, and each planted
    run's ratios less their mean, scaled by sqrt(k / (k - 1)) so their spread is unbiased."""
    parts = [np.asarray(aa, dtype=float)]
    for ratios in planted:
        r = np.asarray(ratios, dtype=float)
        if len(r) >= 2:
            parts.append((r - r.mean()) * math.sqrt(len(r) / (len(r) - 1)))
    pool = np.concatenate(parts)
    return pool[np.isfinite(pool)]


def resample(pool: np.ndarray, blocks: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """`draws` synthetic null experiments of `blocks` log ratios each: drawn from the pool with
    replacement, each with a random sign (A and B are exchangeable when nothing changed). A
    pool of fewer than MIN_POOL ratios is too coarse to resample (two values give identical
    blocks half the time): then the draws are normal with the pool's root mean square."""
    pool = np.asarray(pool, dtype=float)
    if len(pool) < MIN_POOL:
        return rng.normal(0.0, float(np.sqrt(np.mean(pool**2))), size=(draws, blocks))
    picks = rng.choice(pool, size=(draws, blocks), replace=True)
    return picks * rng.choice([-1.0, 1.0], size=(draws, blocks))


def verdicts(
    draws: np.ndarray, slowdown: float, higher_is_better: bool, rule: Rule = Rule()
) -> list[str]:
    """The verdict of each experiment (row of log ratios) with B slowed by `slowdown` (+x time
    per unit of work: tok/s / (1 + x), ms * (1 + x)): the t-interval of stats.paired_change."""
    shift = math.log1p(slowdown) * (-1.0 if higher_is_better else 1.0)
    x = np.asarray(draws, dtype=float) + shift
    n = x.shape[1]
    mean, half = x.mean(axis=1), t_quantile(rule.level, n - 1) * x.std(axis=1, ddof=1) / n**0.5
    return [
        decide(lo, hi, higher_is_better, rule)
        for lo, hi in zip(mean - half, mean + half, strict=True)
    ]


def false_positive_rate(draws: np.ndarray, higher_is_better: bool, rule: Rule = Rule()) -> float:
    """Share of no-change experiments called "faster" or "slower"."""
    found = verdicts(draws, 0.0, higher_is_better, rule)
    return sum(v in (FASTER, SLOWER) for v in found) / len(found)


def detection_rate(
    draws: np.ndarray, slowdown: float, higher_is_better: bool, rule: Rule = Rule()
) -> float:
    """Share of experiments with B slowed by `slowdown` called "slower"."""
    found = verdicts(draws, slowdown, higher_is_better, rule)
    return sum(v == SLOWER for v in found) / len(found)


def min_detectable_slowdown(
    draws: np.ndarray, higher_is_better: bool, rule: Rule = Rule(), power: float = POWER
) -> float | None:
    """The smallest slowdown called "slower" in `power` of the experiments (bisection on a log
    scale; the same draws at every step, so the rate only grows with the slowdown); None when
    even +LARGEST is not."""
    if detection_rate(draws, LARGEST, higher_is_better, rule) < power:
        return None
    low, high = 1e-4, LARGEST
    if detection_rate(draws, low, higher_is_better, rule) >= power:
        return low
    for _ in range(30):
        mid = math.sqrt(low * high)
        low, high = (
            (low, mid)
            if detection_rate(draws, mid, higher_is_better, rule) >= power
            else (mid, high)
        )
    return high


def write(report: PowerReport, directory: Path) -> Path:
    """results/power/<scenario>.json, the figures reports quote."""
    path = Path(directory) / f"{report.scenario}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
    tmp.replace(path)
    return path
