"""`bench run SCENARIO --concurrency C [--abba]`: two arms, fresh servers, a verdict."""

from __future__ import annotations

from pathlib import Path

import typer

from engine.config import ConfigError, load_scenario
from harness.analysis.stats import MIN_BLOCKS, schedule
from harness.commands import schedule as s
from harness.commands import workload as w
from harness.commands.report import report_run
from harness.errors import BenchError, ExitCode
from harness.measure.arms import resolve_arms
from harness.show.comparison import render
from harness.show.console import fail, notes

HELP = """Compare two arms on fresh servers; exit 1 when B's headline figure is slower.

\b
Exit codes: 0 done, 1 B slower, 2 bad usage or an error, 3 a crash (a bug),
4 a server failed during the run (its slot left out), 130 interrupted.

\b
Blocks (--blocks, default 2): A B B A then B A A B with --abba, else A B
then B A, in turn. One block shows the change and its interval but no
verdict ("not enough data", exit 0): within one block a server's position
cannot be told from its arm (docs/STATISTICS.md).

\b
Continue (--out DIR --continue): the same command adds --blocks more blocks
to the run in DIR, their order alternating on from its last block, and
judges all of them as one run; a setup that differs is refused (exit 2).

\b
Arms: --arm NAME=SPEC, twice (A then B). Default: A = the merge-base of HEAD
with main, B = the working tree. SPEC is one of:
  main                  a git ref (of this directory's repository)
  worktree              the working tree, uncommitted changes included
  engine.mixing=true    the working tree with scenario overrides
  http://host:8000      a running OpenAI-compatible server (no spans)
\b
Examples:
  bench run qwen35 -c 64 --abba
  bench run qwen35 -c 64 --abba --blocks 3 --arm base=main --arm new=worktree
  bench run qwen35 -c 64 --abba --blocks 1 --out results/x --continue
  bench run qwen35 -c 64 --arm off=worktree --arm on=engine.mixing=true
  bench run qwen35 --request-rate 20 --arm a=main --arm b=worktree
"""


def _main(
    scenario: str = typer.Argument(..., help="Scenario name (bench scenarios lists them)."),
    abba: bool = typer.Option(False, "--abba", help="ABBA and BAAB blocks in turn (else AB, BA)."),
    blocks: int = typer.Option(
        MIN_BLOCKS, min=1, help="Blocks, alternating their order (--continue: to add)."
    ),
    arm: list[str] = typer.Option([], "--arm", help="NAME=SPEC, twice (A then B); see above."),
    period: int = s.PERIOD,
    size: str | None = s.SIZE,
    out: Path | None = s.OUT,
    overwrite: bool = s.OVERWRITE,
    continue_run: bool = typer.Option(
        False,
        "--continue",
        help="Add --blocks more blocks to the run in --out (same arms, scenario, load,"
        " --abba); the comparison covers every block.",
    ),
    stall_timeout: float = s.STALL_TIMEOUT,
    shards: int = s.SHARDS,
    margin: float = typer.Option(0.05, min=0.0, help="No change: whole CI within +-this."),
    time_budget: float | None = s.TIME_BUDGET,
    report: bool = typer.Option(False, "--report", help="Write report.md and plots too."),
    as_json: bool = s.AS_JSON,
    load_options: dict | None = None,
) -> None:
    console = notes()
    try:
        resolved = load_scenario(scenario, size)
        arms = resolve_arms(arm)
        engines = s.arm_scenarios(arms, resolved)
        load = w.workload(resolved, s.vocab(resolved), **load_options)
        continued = s.continued_run(out, overwrite) if continue_run else None
    except (ConfigError, BenchError) as exc:
        fail(str(exc))
    if resolved.size_reason != "asked for":
        console.print(f"size [bold]{resolved.size}[/] ({resolved.size_reason})")
    if arms[0].same_code_as(arms[1]):
        console.print("arms A and B run the same code and settings: this is an A/A check")
    first = continued.next_block if continued else 0
    letters = schedule(first + blocks, abba)
    by_letter = {a.letter: a for a in arms}
    block_size = 4 if abba else 2
    settings = {"stall_s": stall_timeout, "margin": margin, "time_budget_s": time_budget}
    plan = load.plan(
        resolved, by_letter, letters, block_size, period, shards, first_block=first, **settings
    )
    rundir, complete, result = s.execute(
        plan, engines, console, out, overwrite, load.measured, continued
    )
    if report:  # before the exit-code checks, so a regression still gets its report
        console.print(f"report: {report_run(rundir.path)}")
    s.conclude(console, rundir, complete, result, render(result), as_json)
    if result.regression:
        raise typer.Exit(ExitCode.SLOWER)


_main.__doc__ = HELP
main = w.with_load_options(*(name for name in w.OPTIONS if name != "goodput"))(_main)
