"""Running a plan for `bench run`, `bench measure` and `bench sweep`: the pre-flight, the run
directory and its manifest, progress, the schedule, a failure said in one line, and how the
run ends (exit codes: docs/RELIABILITY.md). Not a command: the options are options.py's, the
arms targets.py's, --blocks and the verdict's exit blocks.py's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from harness.analysis.comparison import Comparison
from harness.analysis.deciding import deciding_estimate, slot_values
from harness.analysis.summary import Summary
from harness.commands.targets import arm_manifest
from harness.errors import BenchError, ExitCode
from harness.measure.continuation import continued_manifest, machine_note
from harness.measure.preflight import preflight
from harness.measure.run_plan import RunPlan
from harness.measure.runner import run_schedule
from harness.results import RunDir, new_run_id, new_run_path
from harness.scenario import Scenario
from harness.show.console import fail, output
from harness.show.cpu_run import estimate_text, layout_text
from harness.show.progress import RunProgress


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
