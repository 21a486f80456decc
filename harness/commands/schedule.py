"""Running a plan for `bench run`, `bench measure` and `bench sweep`: the arms' scenarios, the
pre-flight, the run directory and its manifest, progress, the schedule, a failure said in one
line, and how the run ends (exit codes: docs/RELIABILITY.md). Not a command."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console

from harness.analysis.block_model import MIN_BLOCKS
from harness.analysis.comparison import Comparison
from harness.analysis.deciding import deciding_estimate, slot_values
from harness.analysis.summary import Summary
from harness.analysis.verdict import FAIL_AT, MARGIN, NOT_ENOUGH, Rule
from harness.errors import BenchError, ExitCode
from harness.measure.arms import Arm, resolve
from harness.measure.continuation import continued_manifest, machine_note
from harness.measure.preflight import preflight
from harness.measure.run_plan import RunPlan
from harness.measure.runner import run_schedule
from harness.measure.watch import STALL_S
from harness.results import RunDir, new_run_id, new_run_path
from harness.scenario import Scenario, load_scenario
from harness.show.console import fail, output
from harness.show.cpu_run import estimate_text, layout_text
from harness.show.format import change_text
from harness.show.progress import RunProgress

# the options bench run, measure and sweep declare alike (their load's: workload.py)
SIZE = typer.Option(None, help="Model size (default: by machine).")
PERIOD = typer.Option(
    100,
    min=1,
    help="Span window: every this many worker iterations each span's timings are sent as one "
    "record (docs/SPANS.md); smaller is finer in time, with more records.",
)
SHARDS = typer.Option(1, min=1, help="Client processes for the load.")
OUT = typer.Option(None, help="Run directory (default results/<run-id> under this directory).")
OVERWRITE = typer.Option(False, "--overwrite", help="Replace the run already in --out.")
STALL_TIMEOUT = typer.Option(
    STALL_S, min=1, help="Seconds without a finished request before a server has stalled."
)
TIME_BUDGET = typer.Option(
    None,
    "--time-budget",
    min=1.0,
    help="Seconds the schedule may take: a block (a sweep: a load) starts only if the longest"
    " so far still fits; what ran is whole and summarised.",
)
AS_JSON = typer.Option(False, "--json", help="Print the summary as JSON.")
MARGIN_OPTION = typer.Option(
    MARGIN, min=0.0, help="No change: the interval covers 0 and lies within +-this (0.02: 2%)."
)
FAIL_AT_OPTION = typer.Option(
    FAIL_AT,
    min=0.0,
    help="Exit 1 when the headline is slower by at least this (0.01: 1%); a smaller"
    " significant slowdown is reported and exits 0.",
)
MAX_BLOCKS = 8  # --blocks auto's cap by default: 32 servers with --abba
ALLOW_INTERFERENCE = typer.Option(
    False,
    "--allow-interference",
    envvar="BENCH_ALLOW_INTERFERENCE",
    help="Keep the verdict (and its exit code) when the servers saw different loads from"
    " outside the run; the doubt is still shown. For a machine known to be shared (the"
    " project's own test suite sets it: its pytest and fixtures run outside each run).",
)
URL_SCENARIO = typer.Option("qwen35", help="For a URL: the scenario whose load to send.")
CLUSTER = typer.Option(
    None,
    "--cluster",
    help="Run the blocks as Ray tasks, each block whole on one node (one GPU, or a CPU):"
    " 'auto' (a local Ray on this machine), ray://HOST:PORT or HOST:PORT (docs/SCALE.md).",
)


def execute(
    plan: RunPlan,
    engines: dict[str, Scenario | None],
    console: Console,
    out: Path | None,
    overwrite: bool,
    measured: int,
    continued: RunDir | None = None,
    cluster: str | None = None,
    **manifest,
) -> tuple[RunDir, bool, Summary]:
    """Check the plan (`preflight`), then run it into `out` (default results/<run-id> under
    the current directory): the run directory, whether the schedule finished, and the run's
    summary. `engines` holds each arm's scenario by letter (`arm_scenarios`). With `continued`
    (`continued_run`) the plan's blocks are added to that run, once its setup is this one's.
    With `cluster` (--cluster) the blocks run as tasks on that Ray cluster (harness/cluster/)."""
    arms = [arm_manifest(arm, engines[letter]) for letter, arm in sorted(plan.arms.items())]
    command = " ".join(redacted(sys.argv))
    try:
        check_connections(plan)
        joined = _joined(cluster, plan)
        for note in preflight(plan, engines):  # before any server starts, or any file
            console.print(f"[yellow]note: {note}[/]")  # is written
        if continued is not None:
            rundir = continued
            planned = plan.manifest(rundir.manifest.get("run_id"), command, measured, arms)
            rundir.write_manifest(continued_manifest(rundir.manifest, planned, plan.first_block))
            note = machine_note(rundir.manifest)
            if note:
                console.print(f"[yellow]note: {note}[/]")
        else:
            path = new_run_path(plan.scenario.name)
            rundir = RunDir.fresh(out, overwrite) if out else RunDir(path)
            run_id = new_run_id(plan.scenario.name) if out else rundir.path.name
            rundir.write_manifest(plan.manifest(run_id, command, measured, arms, **manifest))
    except BenchError as exc:
        fail(str(exc))
    try:
        if joined is not None:
            from harness.cluster.blocks import run_schedule as on_cluster

            complete, summary = on_cluster(plan, rundir, joined, console.print)
        else:
            with RunProgress(console, len(plan.letters), measured + plan.warmup) as progress:
                complete, summary = run_schedule(plan, rundir, progress.show, _noise(plan, console))
    except BenchError as exc:
        if "error" not in rundir.manifest:  # a failed write has recorded its own
            rundir.update_manifest(error=str(exc))
        fail(f"{exc} (partial results in {rundir.path})")
    return rundir, complete, summary


def _noise(plan: RunPlan, console: Console):
    """On a CPU run of two engine arms: the processes' cores said before the run, and after
    its first block how long a deciding run takes here (show/cpu_run.py); None elsewhere."""
    if plan.scenario.engine.device != "cpu" or plan.points or "B" not in plan.arms:
        return None
    if any(arm.kind == "url" for arm in plan.arms.values()):
        return None
    if (layout := plan.cpu_layout) is not None:
        console.print(layout_text(layout.manifest()), soft_wrap=True)

    def first_block(slots, seconds: float) -> None:
        estimate = deciding_estimate(slot_values(slots), seconds, plan.rule)
        if estimate is not None:
            console.print(estimate_text(estimate, plan.rule), soft_wrap=True)

    return first_block


def _joined(cluster: str | None, plan: RunPlan):
    """The Ray cluster --cluster names, joined (None: run here)."""
    if cluster is None:
        return None
    if plan.time_budget_s is not None:
        raise BenchError("--time-budget counts blocks run in turn; --cluster runs them at once")
    from harness.cluster.connect import connect

    return connect(cluster)


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


def verdict_rule(margin: float, fail_at: float, max_blocks: int | None = None, look=1) -> Rule:
    """The rule the comparison is judged by; with --blocks auto (`max_blocks`), look `look`'s
    of its looks: one at MIN_BLOCKS blocks and one after each block added up to the cap."""
    rule = Rule(margin=margin, fail_at=fail_at)
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


# Descriptors a load process keeps beside its connections (its event loop, logs, pipes).
SPARE_FILES = 64


def check_connections(plan: RunPlan) -> None:
    """Refuse a load whose client processes would need more connections than they may open
    (RLIMIT_NOFILE): such a run never gets its requests out, and measures nothing."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    most = max(plan.load(slot).concurrency for slot in range(len(plan.letters)))
    per_process = -(-most // plan.shards)
    if soft != resource.RLIM_INFINITY and per_process + SPARE_FILES > soft:
        raise BenchError(
            f"-c {most} needs {per_process} connections a client process and this machine"
            f" allows {soft} open files (ulimit -n): give -c {(soft - SPARE_FILES) * plan.shards}"
            " or less, or more --shards"
        )


def continued_run(out: Path | None, overwrite: bool) -> RunDir:
    """The run in --out that `--continue` adds blocks to; nothing is written to it yet."""
    if out is None:
        raise BenchError("--continue adds blocks to the run in --out DIR: give --out")
    if overwrite:
        raise BenchError("--continue adds to the run in --out, --overwrite replaces it: give one")
    return RunDir.continued(out)


def conclude(
    console: Console, rundir: RunDir, complete: bool, summary: Summary, shown, as_json: bool
) -> None:
    """Print the summary (JSON, or `shown`, its tables) and where it lies; exit 130 when the
    schedule was cut short, 4 when a server failed during it (its slot left out). The caller
    then says whether the figures fail the run (exit 1)."""
    if as_json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        output().print(shown)
        console.print(f"results: {rundir.path}")
    if not complete:
        console.print("[yellow]interrupted: the results above cover what was measured[/]")
        raise typer.Exit(ExitCode.INTERRUPTED)
    failed = rundir.manifest.get("failed_servers")
    if failed:
        of = "the comparison" if isinstance(summary, Comparison) else "the figures"
        console.print(f"[yellow]failed and left out of {of}: {', '.join(failed)}[/]")
        raise typer.Exit(ExitCode.SERVER_FAILED)  # not a verdict on the whole schedule
    if isinstance(summary, Comparison) and summary.failed:
        empty = summary.empty_arms
        said = (
            f"arm {' and '.join(empty)} has no server with a usable headline: no comparison"
            if empty
            else f"failed and left out of the comparison: {', '.join(summary.failed_servers)}"
        )
        console.print(f"[yellow]{said}[/]")
        raise typer.Exit(ExitCode.SERVER_FAILED)
    if isinstance(summary, Comparison) and summary.withheld:
        console.print(
            "[yellow]verdict withheld: interference (see the doubt); rerun on a quiet"
            " machine, or give --allow-interference on a machine known to be shared[/]"
        )
        raise typer.Exit(ExitCode.INTERFERENCE)


def redacted(argv: list[str]) -> list[str]:
    """The command line with --header values hidden (they may carry credentials)."""
    out = list(argv)
    for i, word in enumerate(out):
        if word.startswith("--header="):
            out[i] = "--header=" + word.split("=", 1)[1].split(":", 1)[0] + ":***"
        elif word == "--header" and i + 1 < len(out):
            out[i + 1] = out[i + 1].split(":", 1)[0] + ":***"
    return out


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def target_arm(target: str, scenario: str, size: str | None) -> tuple[Scenario, Arm]:
    """`bench measure`'s and `bench sweep`'s TARGET as arm A: a scenario (a fresh engine of
    this tree) or a URL, driven with `scenario`'s load."""
    resolved = load_scenario(scenario if is_url(target) else target, size)
    return resolved, resolve("A", target, target if is_url(target) else "worktree")


def arm_scenarios(arms: list[Arm], scenario: Scenario) -> dict[str, Scenario | None]:
    """The scenario each arm's servers run, its overrides applied, by letter (None for a URL
    arm). A load override is refused: every arm must see the same requests."""
    for arm in arms:
        if any(key.startswith("load.") for key in arm.overrides):
            raise BenchError(
                f"arm {arm.name} overrides the load; both arms must see the same requests"
            )
    return {
        arm.letter: None
        if arm.kind == "url"
        else load_scenario(scenario.source, scenario.size, arm.overrides)
        for arm in arms
    }


def arm_manifest(arm: Arm, scenario: Scenario | None) -> dict:
    """The arm as resolved, with the scenario its servers run (scenarios/<letter>.yaml)."""
    if scenario is None:
        return {**arm.manifest(), "scenario": None, "scenario_file": None}
    file = f"scenarios/{arm.letter}.yaml"
    return {**arm.manifest(), "scenario": scenario.to_dict(), "scenario_file": file}


def vocab(scenario: Scenario) -> int:
    from engine.models import vocab_size

    return vocab_size(scenario.model)
