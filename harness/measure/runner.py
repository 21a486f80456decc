"""The schedule: for each slot, a fresh server (or a running one at a URL), warmup, load
(closed or open loop), drain, stop.

Runs the slots block by block, alternating the order (A B B A then B A A B, or A B then
B A: analysis.block_model.schedule), collects every slot's request records and span records into
the run directory as it goes, and stops cleanly on Ctrl-C, SIGTERM or SIGHUP: the server is
stopped, what was measured is written, and the manifest says the run is incomplete. Every
row is stamped with its slot (arm, letter, server, block, slot) as it is recorded; when the
schedule ends the run is summarised, once (`run_schedule`).

Every server runs its arm's scenario file in the run directory (scenarios/<letter>.yaml): the
scenario the manifest records, with the arm's overrides. A server that dies or stalls under
load fails its slot, and so does a load most of whose requests failed: the slot is recorded
with what happened (when, the exit code, the last line of the server's log), the manifest
names it in `failed_servers`, which keeps it out of the comparison, and the schedule goes on.

The plan is run_plan.py's, a slot runs in slot.py, what fails a slot or the run is watch.py's,
and the signals that end it early stop_flag.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from harness.analysis.schema import RequestRecord, ServerRecord
from harness.analysis.summary import Summary
from harness.errors import BenchError
from harness.measure.run_plan import RunPlan
from harness.measure.slot import SlotStatus, run_slot
from harness.measure.spans import SpanCollector
from harness.measure.stop_flag import Interrupted, StopFlag
from harness.measure.watch import Tally
from harness.results import RunDir
from harness.scenario import ConfigError, scenario_source

BlockValues = Callable[[list[tuple[ServerRecord, list[RequestRecord]]], float], None]


def run_schedule(
    plan: RunPlan,
    rundir: RunDir,
    show: Callable[[SlotStatus], None],
    first_block: BlockValues | None = None,
) -> tuple[bool, Summary]:
    """Run every slot, say in the manifest whether the schedule finished, and summarise the
    run (summary.json). A BenchError (a server that cannot start, a write that fails) leaves it
    unsummarised. A finished run most of whose measured requests failed is no result: it is
    summarised (its report shows the failures), then raised as a BenchError (`finish`).
    `first_block(slots, seconds)`: called once this call's first block has run, with each of its
    slots' server and request records and the block's wall time (`bench run`'s estimate)."""
    complete, tally = execute(plan, rundir, show, first_block)
    return complete, finish(rundir, complete, tally)


def finish(rundir: RunDir, complete: bool, tally: Tally) -> Summary:
    """The end of a schedule (run here or on a cluster, harness/cluster/): the manifest says
    whether it finished, the run is summarised, and a finished run most of whose measured
    requests failed is raised as a BenchError."""
    rundir.update_manifest(complete=complete)
    summary = rundir.summarise()
    if complete and tally.mostly_failed:  # not the requests an interruption cut
        error = (
            f"{tally.failed} of {tally.requests} measured requests failed"
            f" (the first: {tally.first_error}); no result"
        )
        rundir.update_manifest(error=error)
        raise BenchError(error)
    return summary


def execute(
    plan: RunPlan,
    rundir: RunDir,
    show: Callable[[SlotStatus], None],
    first_block: BlockValues | None = None,
) -> tuple[bool, Tally]:
    """Run every slot; whether the whole schedule ran, and the measured requests."""
    write_scenarios(plan, rundir)
    layout, block, started = plan.cpu_layout, [], time.monotonic()
    collector = SpanCollector()
    stop = StopFlag()
    tally = Tally()
    budget = _Budget(plan)
    try:
        with stop.installed():
            for slot in range(plan.first_slot, len(plan.letters)):
                if stop.set:
                    return False, tally
                if slot % plan.block_size == 0 and not budget.fits_another_block(slot):
                    rundir.update_manifest(budget_stop=budget.stop_note(slot))
                    return True, tally  # whole blocks: a finished (shorter) schedule
                letter = plan.letters[slot]
                ran = run_slot(plan, rundir, collector, slot, letter, show, stop, tally, layout)
                if first_block is not None and len(block) < plan.block_size:
                    block.append(ran)
                    if len(block) == plan.block_size:
                        first_block(block, time.monotonic() - started)
        return not stop.set, tally
    except Interrupted:
        return False, tally
    finally:
        collector.close()


def write_scenarios(plan: RunPlan, rundir: RunDir) -> None:
    """Each engine arm's scenario file in the run directory, the one its servers run."""
    source = plan.scenario.source or plan.scenario.name
    for letter, arm in plan.arms.items():
        if arm.kind != "url":
            try:
                scenario = scenario_source(source, plan.scenario.size, arm.overrides)
            except ConfigError as exc:  # the file changed since the plan read it
                raise BenchError(str(exc)) from None
            rundir.write_scenario(letter, scenario)


class _Budget:
    """`--time-budget`: at each block's start, whether the call's time so far plus its longest
    block yet still fits the budget. The cut falls between blocks, so every block that ran
    is whole (its ABBA order intact) and the comparison stands on them. A continued run counts
    from its own start, and its first block always runs."""

    def __init__(self, plan: RunPlan):
        self.plan, self.started = plan, time.monotonic()
        self.block_started, self.longest = self.started, 0.0

    def fits_another_block(self, slot: int) -> bool:
        now = time.monotonic()
        if slot != self.plan.first_slot:
            self.longest = max(self.longest, now - self.block_started)
        self.block_started = now
        budget = self.plan.time_budget_s
        first = slot == self.plan.first_slot
        return budget is None or first or now - self.started + self.longest <= budget

    def stop_note(self, slot: int) -> str:
        size, first = self.plan.block_size, self.plan.first_slot
        done, planned = (slot - first) // size, (len(self.plan.letters) - first) // size
        unit = "load points" if self.plan.points else "blocks"  # a sweep's block: one load
        return (
            f"the time budget ({self.plan.time_budget_s:g} s) ended the schedule after {done} of"
            f" {planned} {unit} (the longest took {self.longest:.0f} s)"
        )
