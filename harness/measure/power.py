"""`bench power`'s runs (docs/POWER.md): one A/A run of ABBA blocks, then one run per level
whose arm B carries a planted, known slowdown (`engine.planted_delay_us`, a busy-wait inside
the worker's postprocess) sized as a fraction of the A/A iteration time. Each configuration
is an ordinary run directory under results/<run>/, run and summarised like `bench run`'s;
analysis/power.py turns them into the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from harness.analysis import power
from harness.analysis.block_model import schedule
from harness.analysis.power import ConfigurationRun
from harness.analysis.power_report import PowerReport
from harness.errors import BenchError
from harness.measure.arms import resolve
from harness.measure.request_sequence import build_requests
from harness.measure.run_plan import RunPlan
from harness.measure.runner import run_schedule
from harness.measure.slot import SlotStatus
from harness.results import RunDir, load_run, machine
from harness.scenario import Scenario, parse_overrides


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
    draws: int = power.DRAWS  # synthetic runs of the pool per rate
    boots: int = power.BOOTSTRAPS  # resamples of the pool behind each rate's interval


def run_configuration(
    plan: PowerPlan, path: Path, delay_us: int, show: Callable[[SlotStatus], None]
) -> ConfigurationRun:
    """One ABBA run: A = the plan's ref, B = the same code with `delay_us` planted (0: A/A)."""
    from engine.models import vocab_size  # torch: not at `bench` start-up

    a = resolve("A", "A", plan.ref)
    b = replace(a, letter="B", name="B")
    if delay_us:
        spec = f"engine.planted_delay_us={delay_us}"
        b = replace(b, kind="overrides", spec=spec, overrides=parse_overrides(spec))
    count = plan.warmup + plan.requests
    run = RunPlan(
        scenario=plan.scenario,
        arms={"A": a, "B": b},
        letters=schedule(plan.blocks, abba=True),
        block_size=4,
        concurrency=plan.concurrency,
        requests=build_requests(plan.scenario.load, vocab_size(plan.scenario.model), count),
        warmup=plan.warmup,
        period=plan.period,
    )
    rundir = RunDir(path)
    run_id = f"power-{path.parent.name}-{path.name}"
    arms = [a.manifest(), b.manifest()]
    rundir.write_manifest(run.manifest(run_id, "bench power", plan.requests, arms))
    name = f"+{delay_us} us" if delay_us else "A/A"
    complete, comparison = run_schedule(run, rundir, show)
    if not complete:
        raise BenchError(f"the {name} run did not finish; partial results in {path}")
    return ConfigurationRun(str(path), load_run(path)[1], comparison, delay_us=delay_us)


def measure(plan: PowerPlan, root: Path, show: Callable[[SlotStatus], None]) -> PowerReport:
    """Run the A/A configuration, then one per level, then analyse them all. `show` sees every
    slot numbered across the whole power run, its arm prefixed by the configuration."""
    slots, total = 4 * plan.blocks, 4 * plan.blocks * (1 + len(plan.levels))

    def run(path: Path, delay_us: int, number: int) -> ConfigurationRun:
        name = f"+{delay_us} us" if delay_us else "A/A"

        def shown(s: SlotStatus) -> None:
            show(replace(s, slot=number * slots + s.slot, slots=total, arm=f"{name}: {s.arm}"))

        return run_configuration(plan, path, delay_us, shown)

    aa = run(root / "aa", 0, 0)
    iteration = power.typical(power.server_values(aa.frames), power.ITERATION)
    if iteration is None:
        raise BenchError(f"no {power.ITERATION} spans in {root / 'aa'}; see its logs/")
    planted = []
    for number, fraction in enumerate(plan.levels, start=1):
        delay_us = max(1, round(fraction * iteration * 1e3))
        planted.append(
            replace(run(root / f"delay-{delay_us}us", delay_us, number), fraction=fraction)
        )
    facts = {
        "scenario": plan.scenario.name,
        "size": plan.scenario.size,
        "machine": machine(),
        "concurrency": plan.concurrency,
        "requests": plan.requests,
        "run_dir": str(root),
    }
    return power.analyse(aa, planted, facts, plan.blocks, plan.seed, plan.draws, plan.boots)
