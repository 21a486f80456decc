"""One engine session for the nightly (benchmarks/bench_session.py): a few fresh servers of one
engine tree under this checkout's harness, their figures per server.

`bench nightly` measures each commit of main; the engine measured is the commit's (its
servers run from a worktree of it), but the load, the collection and the analysis are always
this checkout's, so every commit is measured by one harness version. asv's process has the
commit's tree first on its path (for the microbenchmarks), so the session runs in a process
of its own: `python -m harness.measure.session --tree TREE --out DIR [--commit SHA]`, which
writes DIR/samples.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from harness.analysis import phases, server_figures
from harness.analysis.schema import SERVER_KEY
from harness.measure.arms import Arm
from harness.measure.request_sequence import build_requests
from harness.measure.run_plan import RunPlan
from harness.measure.runner import run_schedule
from harness.results import RunDir, load_run
from harness.scenario import load_scenario

SCENARIO, SIZE = "qwen35", "tiny"
CONCURRENCY, REQUESTS, WARMUP, PERIOD = 4, 16, 2, 100
# fresh servers per commit: the tracked value is their median, the step test's samples. At a
# session's ~6% server spread 5 find a +10% step in 90% of series, 3 in 69% (docs/NIGHTLY.md)
SERVERS = 5


def run_session(tree: Path, commit: str | None, path: Path, servers: int = SERVERS) -> dict:
    """Run the session into the run directory `path`; each tracked figure per server (a
    cost: larger is worse), or RuntimeError when it did not finish."""
    from engine.models import vocab_size

    scenario = load_scenario(SCENARIO, SIZE)
    kind, spec = ("ref", commit) if commit else ("worktree", "worktree")
    arm = Arm("A", "session", kind, spec, commit, tree=str(tree))
    requests = build_requests(scenario.load, vocab_size(scenario.model), WARMUP + REQUESTS)
    letters = ["A"] * servers
    plan = RunPlan(scenario, {"A": arm}, letters, 1, CONCURRENCY, requests, WARMUP, PERIOD)
    rundir = RunDir(path)
    manifest = plan.manifest(f"asv-{path.name}", "asv bench_session", REQUESTS, [arm.manifest()])
    rundir.write_manifest(manifest)
    complete, _ = run_schedule(plan, rundir, lambda status: None)
    if not complete:
        raise RuntimeError(f"the session did not finish; see {path}/logs")
    return samples(load_run(path)[1])


def samples(frames: dict[str, pd.DataFrame]) -> dict[str, list[float | None]]:
    """The tracked figures of each server, in schedule order, as costs: throughput as ms per
    1,000 output tokens, postprocess work per iteration, messages per request, TTFT p50."""
    per_server = server_figures.server_summary(frames["requests"], frames["servers"])
    keys = per_server[SERVER_KEY]
    work = phases.phase_table(frames["spans"], phases.BY_SERVER)
    work = work[work["name"] == phases.POSTPROCESS_WORK]
    messages = phases.message_costs(frames["spans"], phases.BY_SERVER)
    messages = messages[messages["name"] == phases.ALL_MESSAGES]

    def column(frame: pd.DataFrame, name: str) -> list[float | None]:
        joined = keys.merge(frame, on=SERVER_KEY, how="left")[name]
        return [None if pd.isna(v) else float(v) for v in joined]

    tok_s = per_server["output_tok_per_s"]
    return {
        "ms_per_1k_tokens": [float(1e6 / v) if v and v > 0 else None for v in tok_s],
        "postprocess_ms_per_iter": column(work, "ms_per_iter"),
        "message_ms_per_request": column(messages, "ms_per_request"),
        "ttft_p50_ms": [None if pd.isna(v) else float(v) for v in per_server["ttft_p50_ms"]],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, required=True, help="the engine tree to measure")
    parser.add_argument("--out", type=Path, required=True, help="the session's run directory")
    parser.add_argument("--commit", default=None, help="the tree's commit (none: a work tree)")
    parser.add_argument("--servers", type=int, default=SERVERS)
    args = parser.parse_args(argv)
    found = run_session(args.tree, args.commit, args.out, args.servers)
    (args.out / "samples.json").write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
