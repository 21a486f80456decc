"""`bench run SCENARIO --concurrency C [--abba]`: two arms, fresh servers, a verdict."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.analysis.block_model import MIN_BLOCKS, schedule
from harness.commands import options as o
from harness.commands import schedule as s
from harness.commands import workload as w
from harness.commands.blocks import block_count, until_decided, verdict_exit, verdict_rule
from harness.commands.report import report_run
from harness.commands.targets import arm_scenarios, vocab
from harness.errors import BenchError
from harness.measure.arms import resolve_arms
from harness.scenario import ConfigError, load_scenario
from harness.show.comparison import render
from harness.show.console import fail, notes

HELP = """Compare two arms on fresh servers; exit 1 when B's headline figure is slower.

\b
Verdicts: "faster" or "slower" when the interval excludes 0, however small
the change (its size beside it); "no change" when the interval covers 0 and
lies within +-margin (--margin, default 2%); else "not enough data", with
the blocks a decision would likely need (docs/STATISTICS.md). Intervals at
--confidence (default 95%): an A/A run reads "faster" or "slower" at most
5% of the time; 0.99 or 0.999 for a gate that must rarely cry wolf.

\b
Exit codes: 0 done, 1 B's headline slower by at least --fail-at (default
1%; a smaller significant slowdown is reported and exits 0), 2 bad usage or
an error, 3 a crash (a bug), 4 a server failed (died, stalled, or measured
no throughput) or an arm has no usable server, 5 interference: the arms saw
different loads from outside the run (rerun on a quiet machine),
130 interrupted.

\b
Blocks (--blocks, default 2): A B B A then B A A B with --abba, else A B
then B A, in turn. One block shows the change and its interval but no
verdict ("not enough data", exit 0): within one block a server's position
cannot be told from its arm (docs/STATISTICS.md). --blocks auto runs 2
blocks, then adds one at a time until the headline is decided or
--max-blocks is reached; each look's interval is widened so that the
chance of a false verdict over all looks stays at most 1 - --confidence.

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
  dir:/path/to/tree     the engine of another tree (a commit's git archive)
  http://host:8000      a running OpenAI-compatible server (no spans)
\b
Examples:
  bench run qwen35 -c 64 --abba
  bench run qwen35 -c 64 --abba --blocks 3 --arm base=main --arm new=worktree
  bench run qwen35 -c 64 --abba --blocks auto --max-blocks 6 --fail-at 0.02
  bench run qwen35 -c 64 --abba --blocks 1 --out results/x --continue
  bench run qwen35 -c 64 --arm off=worktree --arm on=engine.mixing=true
  bench run qwen35 --request-rate 20 --arm a=main --arm b=worktree
"""


def main(
    scenario: str = typer.Argument(..., help="Scenario name (bench scenarios lists them)."),
    abba: bool = typer.Option(False, "--abba", help="ABBA and BAAB blocks in turn (else AB, BA)."),
    blocks: str = typer.Option(
        str(MIN_BLOCKS),
        help="Blocks, alternating their order (--continue: to add); 'auto': add blocks until"
        " the headline is decided, up to --max-blocks.",
    ),
    max_blocks: int = typer.Option(
        o.MAX_BLOCKS, min=MIN_BLOCKS, help="With --blocks auto: the most blocks in all."
    ),
    arm: list[str] = typer.Option([], "--arm", help="NAME=SPEC, twice (A then B); see above."),
    period: int = o.PERIOD,
    size: str | None = o.SIZE,
    out: Path | None = o.OUT,
    overwrite: bool = o.OVERWRITE,
    continue_run: bool = typer.Option(
        False,
        "--continue",
        help="Add --blocks more blocks to the run in --out (same arms, scenario, load,"
        " --abba); the comparison covers every block.",
    ),
    stall_timeout: float = o.STALL_TIMEOUT,
    shards: int = o.SHARDS,
    margin: float = o.MARGIN_OPTION,
    fail_at: float = o.FAIL_AT_OPTION,
    confidence: float = o.CONFIDENCE_OPTION,
    allow_interference: bool = o.ALLOW_INTERFERENCE,
    time_budget: float | None = o.TIME_BUDGET,
    report: bool = typer.Option(False, "--report", help="Write report.md and plots too."),
    cluster: str | None = o.CLUSTER,
    as_json: bool = o.AS_JSON,
    # the load (options.py), gathered in w.LoadOptions below
    concurrency: int | None = o.CONCURRENCY,
    requests: int | None = o.REQUESTS,
    duration: float | None = o.DURATION,
    warmup: int | None = o.WARMUP,
    request_rate: float | None = o.REQUEST_RATE,
    burstiness: float = o.BURSTINESS,
    input_len: int | None = o.INPUT_LEN,
    output_len: int | None = o.OUTPUT_LEN,
    prompts: Path | None = o.PROMPTS,
    tokenizer: str | None = o.TOKENIZER,
    seed: int | None = o.SEED,
    chat: bool = o.CHAT,
    header: list[str] = o.HEADER,
) -> None:
    console = notes()
    try:
        count, auto = block_count(blocks)
        resolved = load_scenario(scenario, size)
        arms = resolve_arms(arm)
        engines = arm_scenarios(arms, resolved)
        options = w.LoadOptions.given(locals())
        load = w.workload(resolved, vocab(resolved), options)
        continued = s.continued_run(out, overwrite) if continue_run else None
    except (ConfigError, BenchError) as exc:
        fail(str(exc))
    if resolved.size_reason != "asked for":
        console.print(f"size [bold]{resolved.size}[/] ({resolved.size_reason})")
    if arms[0].same_code_as(arms[1]):
        console.print("arms A and B run the same code and settings: this is an A/A check")
    by_letter = {a.letter: a for a in arms}
    block_size = 4 if abba else 2
    settings = {"stall_s": stall_timeout, "time_budget_s": time_budget}
    settings["allow_interference"] = allow_interference

    def run_blocks(continued, count: int, rule):
        first = continued.next_block if continued else 0
        letters = schedule(first + count, abba)
        plan = load.plan(
            resolved, by_letter, letters, block_size, period, shards, first_block=first,
            rule=rule, **settings,
        )  # fmt: skip
        return s.execute(
            plan, engines, console, out, overwrite, load.measured, continued, cluster=cluster
        )

    def rules(look: int):
        return verdict_rule(margin, fail_at, confidence, max_blocks if auto else None, look)

    if auto and continued is not None:
        count = max(1, MIN_BLOCKS - continued.next_block)
    rundir, complete, result = until_decided(
        run_blocks, continued, count, rules, max_blocks if auto else 0, time_budget, console
    )
    if report:  # before the exit-code checks, so a regression still gets its report
        console.print(f"report: {report_run(rundir.path)}")
    s.conclude(console, rundir, complete, result, render(result), as_json)
    verdict_exit(console, result)


main.__doc__ = HELP
