"""How many blocks a run has and when it has enough: --blocks (a count, or `auto`), the verdict
rule of each look, `until_decided` (auto's one block at a time), and the verdict's exit code."""

from __future__ import annotations

import time
from collections.abc import Callable

import typer
from rich.console import Console

from harness.analysis.block_model import MIN_BLOCKS
from harness.analysis.comparison import Comparison
from harness.analysis.summary import Summary
from harness.analysis.verdict import NOT_ENOUGH, Rule
from harness.errors import BenchError, ExitCode
from harness.results import RunDir
from harness.show.console import fail
from harness.show.format import change_text


def block_count(text: str) -> tuple[int, bool]:
    """--blocks: a count of blocks (1 or more), or 'auto' (MIN_BLOCKS first, then more)."""
    if text.strip().lower() == "auto":
        return MIN_BLOCKS, True
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise BenchError(f"--blocks is a count of blocks (1 or more) or 'auto', not {text!r}")
    return count, False


def verdict_rule(
    margin: float, fail_at: float, level: float, max_blocks: int | None = None, look: int = 1
) -> Rule:
    """The rule the comparison is judged by (--margin, --fail-at, --confidence); with --blocks
    auto (`max_blocks`), look `look`'s of its looks: one at MIN_BLOCKS blocks and one after
    each block added up to the cap."""
    rule = Rule(level=level, margin=margin, fail_at=fail_at)
    return rule if max_blocks is None else rule.sequential(max_blocks - MIN_BLOCKS + 1, look)


def until_decided(
    run_blocks: Callable[[RunDir | None, int, Rule], tuple[RunDir, bool, Summary]],
    continued: RunDir | None,
    count: int,
    rules: Callable[[int], Rule],
    max_blocks: int,
    time_budget: float | None,
    console: Console,
) -> tuple[RunDir, bool, Summary]:
    """Run `count` blocks (`run_blocks(continued, count, rules(1))`); with `max_blocks`
    (--blocks auto) add one block at a time, judged at `rules(look)`, while the headline is
    "not enough data", the run has fewer than `max_blocks` blocks, nothing failed, and the
    time budget fits one more call as long as the longest so far."""
    started = time.monotonic()
    longest, look = 0.0, 1
    while True:
        call_started = time.monotonic()
        rundir, complete, result = run_blocks(continued, count, rules(look))
        longest = max(longest, time.monotonic() - call_started)
        if not max_blocks or not complete or not isinstance(result, Comparison):
            return rundir, complete, result
        row = result.headline_row
        undecided = row is not None and row.change.verdict == NOT_ENOUGH
        stop = rundir.manifest.get("failed_servers") or rundir.manifest.get("budget_stop")
        if not undecided or result.failed or stop:
            return rundir, complete, result
        try:
            continued = RunDir.continued(rundir.path)
        except BenchError as exc:
            fail(f"{exc} (partial results in {rundir.path})")
        held = continued.next_block
        if held >= max_blocks:
            console.print(f"--blocks auto: {held} blocks (--max-blocks) and still undecided")
            return rundir, complete, result
        if time_budget is not None and time.monotonic() - started + longest > time_budget:
            console.print(f"--blocks auto: the time budget ends the run at {held} blocks")
            return rundir, complete, result
        console.print(
            f"--blocks auto: {held} blocks, {row.label} {change_text(row.change)}:"
            f" not enough data; adding block {held + 1} (of at most {max_blocks})"
        )
        count, look = 1, look + 1


def verdict_exit(console: Console, result: Comparison) -> None:
    """The verdict's exit code: 1 when B's headline is slower by at least the rule's
    fail_at; a smaller significant slowdown is said, and exits 0."""
    slower = result.slower_by
    if result.regression:
        raise typer.Exit(ExitCode.SLOWER)
    if slower is not None:
        console.print(
            f"[yellow]B's headline is slower by {slower:.2%}, under --fail-at"
            f" {result.rule.fail_at:.1%}: exit 0[/]"
        )
