"""Phase timing on against off, as an ABBA run of the harness (docs/BENCHMARKS.md).

    python scripts/timing_cost.py [--size tiny] [-c 8] [--blocks 2] [--requests 48]
                                  [--warmup 8] [--period 100] [--ref worktree] [--out DIR]

Arm A runs the tree (--ref, default the working tree) with phase timing at --period, arm B
the same tree with timing off; blocks alternate ABBA and BAAB. It prints the comparison (B
against A: a positive throughput change is what timing costs) and the worker's own
bookkeeping span (worker.timing.flush) from arm A. The run directory is kept (default
results/timing-cost-<time>/), so `bench report` can lay it out.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import spans  # noqa: E402
from engine.models import vocab_size  # noqa: E402
from harness.analysis.block_model import schedule  # noqa: E402
from harness.measure.arms import resolve  # noqa: E402
from harness.measure.request_sequence import build_requests  # noqa: E402
from harness.measure.run_plan import RunPlan  # noqa: E402
from harness.measure.runner import run_schedule  # noqa: E402
from harness.results import RESULTS, RunDir  # noqa: E402
from harness.scenario import load_scenario  # noqa: E402
from harness.show.comparison import render  # noqa: E402
from harness.show.console import output  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default=None)
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--period", type=int, default=100)
    parser.add_argument("--ref", default="worktree", help="a git ref, or worktree")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    scenario = load_scenario("qwen35", args.size)
    timed = resolve("A", "timing on", args.ref)
    untimed = replace(timed, letter="B", name="timing off")
    count = args.warmup + args.requests
    plan = RunPlan(
        scenario=scenario,
        arms={"A": timed, "B": untimed},
        letters=schedule(args.blocks, abba=True),
        block_size=4,
        concurrency=args.concurrency,
        requests=build_requests(scenario.load, vocab_size(scenario.model), count),
        warmup=args.warmup,
        period=args.period,
        untimed=("B",),
    )
    run_id = time.strftime("timing-cost-%Y%m%d-%H%M%S")
    rundir = RunDir(args.out or RESULTS / run_id)
    arms = [timed.manifest(), untimed.manifest()]
    rundir.write_manifest(plan.manifest(run_id, " ".join(sys.argv), args.requests, arms))
    complete, result = run_schedule(plan, rundir, lambda status: None)
    output().print(render(result))
    flush = next((p for p in result.phases if p.name == spans.SPAN_FLUSH), None)
    if flush is not None:
        print(f"{spans.SPAN_FLUSH}: {flush.a_ms:.4f} ms per iteration in arm A")
    print(f"results: {rundir.path} ({'complete' if complete else 'incomplete'})")


if __name__ == "__main__":
    main()
