"""`bench run --continue` (INVARIANTS 52): blocks added to a recorded run are judged with the
recorded ones as one run; a call whose setup differs is refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis.block_model import schedule
from harness.analysis.schema import ServerRecord, Slot
from harness.analysis.summary import summarize
from harness.errors import BenchError
from harness.measure.continuation import continued_manifest, machine_note
from harness.results import RunDir, load_run, summarise
from tests.synthetic_run import STEADY, STREAMS, _requests, _spans
from tests.test_faults_harness import LOAD, bench, mock_url  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parent.parent
RATES = [100.0, 95.0, 96.0, 101.0, 94.0, 99.0, 100.0, 95.0]  # A B B A, then B A A B
MACHINE = {"host": "ci", "cpu": "x86_64", "cpus": 2, "gpu": None, "torch": "2.13", "cuda": None}
ARMS = [
    {"letter": "A", "name": "base", "kind": "ref", "spec": "main", "commit": "c1", "dirty": False,
     "diff_hash": None, "overrides": {}, "url": None, "tree": "/wt/a", "scenario": {"name": "q"}},
    {"letter": "B", "name": "new", "kind": "worktree", "spec": "worktree", "commit": "c1",
     "dirty": True, "diff_hash": "d1", "overrides": {}, "url": None, "tree": "/work",
     "scenario": {"name": "q"}},
]  # fmt: skip


def manifest(blocks: int, **changes) -> dict:
    """A call's manifest as `RunPlan.manifest` writes it, for a schedule of `blocks` blocks."""
    scenario = {"name": "qwen35", "size": "tiny", "headline": "output_tok_per_s"}
    return {
        "run_id": "run",
        "command": "bench run qwen35 -c 4 --abba",
        "unix_time": 1.0,
        "scenario": scenario | {"engine": {}, "load": {}, "model": {}, "source": "/a/q.yaml"},
        "arms": ARMS,
        "aa_check": False,
        "schedule": schedule(blocks, True),
        "block_size": 4,
        "concurrency": STREAMS,
        "load": {"mode": "closed", "concurrency": STREAMS, "api": "completions"},
        "requests": None,
        "request_digest": "r1",
        "duration_s": 4.0,
        "warmup": STREAMS,
        "period": 100,
        "margin": 0.05,
        "time_budget_s": None,
        "untimed": [],
        "machine": MACHINE,
        "complete": False,
    } | changes


def run_blocks(run: RunDir, first: int, blocks: int) -> None:
    """Blocks first .. first + blocks - 1 of the A B B A / B A A B schedule, each server's rate
    RATES[slot]: the rows the runner would append."""
    letters = schedule(first + blocks, True)
    for slot in range(4 * first, len(letters)):
        letter = letters[slot]
        arm = "base" if letter == "A" else "new"
        where = Slot(arm, letter, f"{letter}{slot}", slot // 4, slot)
        t0 = 1000.0 + 100 * slot
        process = {"port": 9000 + slot, "log": "", "t0_unix": t0, "start_unix": t0 - 1}
        window = {"steady_start_s": STEADY[0], "steady_end_s": STEADY[1]}
        requests = _requests(where, STREAMS / RATES[slot], 0)
        server = ServerRecord(
            **asdict(where), **process, healthy=True, requests=len(requests), **window
        )
        run.append_slot(requests, _spans(where, t0), server)
    run.update_manifest(complete=True)


def test_continued_run_equals_the_run_done_at_once(tmp_path):
    """One block, then one more added: the same tables (the second block B A A B, numbered 1),
    the same comparison as the two blocks run in one call; the calls say where each ran."""
    once = RunDir(tmp_path / "once")
    once.write_manifest(manifest(2))
    run_blocks(once, 0, 2)
    first = RunDir(tmp_path / "continued")
    first.write_manifest(manifest(1))
    run_blocks(first, 0, 1)
    summarise(first.path)

    run = RunDir.continued(first.path)
    assert run.next_block == 1
    elsewhere = manifest(2, machine=MACHINE | {"host": "gpu-box"}, unix_time=2.0)
    run.write_manifest(continued_manifest(run.manifest, elsewhere, run.next_block))
    run_blocks(run, 1, 1)
    continued = summarise(run.path)

    manifest_c, frames_c = load_run(run.path)
    manifest_o, frames_o = load_run(once.path)
    for name in frames_o:
        pd.testing.assert_frame_equal(frames_c[name], frames_o[name], check_dtype=False)
    servers = frames_c["servers"]
    assert servers["server"].tolist() == ["A0", "B1", "B2", "A3", "B4", "A5", "A6", "B7"]
    assert servers["block"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert manifest_c["schedule"] == list("ABBABAAB") and manifest_c["complete"]
    assert [(c["first_block"], c["machine"]["host"]) for c in manifest_c["calls"]] == [
        (0, "ci"),
        (1, "gpu-box"),
    ]
    assert manifest_c["calls"][0]["complete"] is True
    assert "gpu-box" in machine_note(manifest_c)
    assert continued.to_json() == summarize(manifest_o, frames_o).to_json()
    headline = next(f for f in continued.figures if f.figure == continued.headline)
    assert headline.change.blocks == 2 and headline.change.df == 5


@pytest.mark.parametrize(
    "changes,says",
    [
        ({"concurrency": 8}, "concurrency: recorded 4, this call 8"),
        ({"arms": [ARMS[0], ARMS[1] | {"spec": "engine.mixing=true"}]}, "arms.B.spec"),
        ({"arms": [ARMS[0] | {"commit": "c2"}, ARMS[1]]}, "arms.A.commit"),
        ({"block_size": 2, "schedule": schedule(2, False)}, "schedule: recorded"),
        ({"scenario": manifest(1)["scenario"] | {"size": "0.8b"}}, "scenario.size"),
        ({"request_digest": "r2"}, "request_digest"),
    ],
)
def test_a_different_setup_is_refused(changes, says):
    with pytest.raises(BenchError, match="differs from this call: " + says.replace(".", r"\.")):
        continued_manifest(manifest(1, complete=True), manifest(2, **changes), 1)


def test_what_may_differ_between_calls():
    """The machine, the time, the command's own words, the arms' trees and the scenario file's
    path; and a run from before the request digest is continued on what it recorded."""
    recorded = manifest(1, complete=True, budget_stop="cut")
    del recorded["request_digest"], recorded["block_size"]
    arms = [arm | {"tree": "/elsewhere"} for arm in ARMS]
    scenario = recorded["scenario"] | {"source": "/b/q.yaml", "size_reason": "by machine"}
    planned = manifest(3, arms=arms, scenario=scenario, machine=MACHINE | {"gpu": "H200"})
    merged = continued_manifest(recorded, planned, 1)
    assert merged["schedule"] == schedule(3, True) and merged["request_digest"] == "r1"
    assert merged["calls"][0]["budget_stop"] == "cut" and "budget_stop" not in merged
    assert merged["complete"] is False and "schema_version" not in merged


def test_a_measurement_is_not_continued():
    with pytest.raises(BenchError, match="bench measure, not a bench run"):
        continued_manifest(manifest(1, kind="measure"), manifest(2), 1)


def test_nothing_to_continue_is_one_line(tmp_path):
    """--continue on a directory that holds no run, or none given: exit 2, nothing written."""
    empty = tmp_path / "empty"
    empty.mkdir()
    args = ["run", "qwen35", "-c", "4", "--arm", "a=worktree", "--arm", "b=worktree"]
    for extra, says in (
        (["--out", str(empty)], "is not a run directory"),
        ([], "give --out"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "harness", *args, *extra, "--continue"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not any(empty.iterdir())


def test_a_run_kept_without_its_tables_says_so(tmp_path):
    """A finished run kept as its report and summary alone (docs/evidence/, gpu_suite's
    evidence tarballs, which leave out the parquet tables) is refused by --continue, by
    `bench compare`'s reader and by `bench report` with that reason, not as a run that measured nothing; a run with its
    tables continues as ever."""
    from harness.commands.report import report_run
    from harness.results import load_runs

    path = tmp_path / "run"
    run = RunDir.fresh(path)
    run.write_manifest(manifest(1))
    run_blocks(run, 0, 1)
    summarise(path)
    assert RunDir.continued(path).next_block == 1  # whole: it continues
    for table in path.glob("*.parquet"):
        table.unlink()
    reads = ((RunDir.continued, "cannot be continued"), (load_runs, "cannot be read again"),
             (report_run, "cannot be reported again"))  # fmt: skip
    for read, consequence in reads:
        with pytest.raises(BenchError) as caught:
            read(path)
        message = str(caught.value)
        assert "kept without its tables" in message and consequence in message
        assert "servers.parquet" in message and "nothing was measured" not in message


def test_a_continued_call_has_its_own_time_budget(tmp_path, mock_url):  # noqa: F811
    """--time-budget counts from the continuing call's start, whose first block always runs:
    one recorded block, then 1 of 3 more, B A A B, whole; two blocks in the comparison."""
    out = tmp_path / "run"
    arms = ["--arm", f"a={mock_url}", "--arm", f"b={mock_url}", "--abba", "--out", str(out)]
    assert bench("run", "qwen35", *LOAD, *arms, "--blocks", "1").returncode == 0
    cut = bench(
        "run",
        "qwen35",
        *LOAD,
        *arms,
        "--blocks",
        "3",
        "--time-budget",
        "1",
        "--continue",
        "--fail-at",
        "0.5",
    )  # an A/A over 2 blocks: its exit code is not what is tested
    assert cut.returncode == 0, cut.stderr
    manifest_, frames = load_run(out)
    assert "ended the schedule after 1 of 3 blocks" in manifest_["budget_stop"]
    assert manifest_["schedule"] == schedule(4, True) and manifest_["complete"]
    servers = frames["servers"].sort_values("slot")
    assert servers["letter"].tolist() == list("ABBABAAB") and servers["slot"].max() == 7
    summary = json.loads((out / "summary.json").read_text())
    headline = next(f for f in summary["figures"] if f["figure"] == summary["headline"])
    assert headline["change"]["blocks"] == 2


@pytest.mark.slow
def test_continue_adds_a_block_end_to_end(tmp_path):
    """One A B block on tiny CPU servers, then --continue one more: four servers, blocks 0 and
    1 in the comparison, the second block B A; a call with another -c or arm is refused and
    leaves the run as it was. (A B blocks, not A B B A: half the servers, and the alternation
    is the same rule, `block_model.schedule`; the ABBA kind is the fast tests'.)"""
    out = tmp_path / "run"

    def call(*extra: str, c: str = "4", b: str = "worktree") -> subprocess.CompletedProcess:
        args = ["run", "qwen35", "-c", c, "--blocks", "1", "--requests", "16"]
        args += ["--warmup", "4", "--period", "10", "--arm", "a=worktree", "--arm", f"b={b}"]
        args += ["--confidence", "0.999"]  # an A/A: at 95% 1 run in 40 reads "slower", exit 1
        command = [sys.executable, "-m", "harness", *args, "--out", str(out), "--json", *extra]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)

    first = call()
    assert first.returncode == 0, first.stderr
    second = call("--continue")
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout)
    manifest_, frames = load_run(out)
    servers = frames["servers"].sort_values("slot")
    assert len(servers) == 4 and servers["block"].tolist() == [0, 0, 1, 1]
    assert servers["letter"].tolist() == list("ABBA")
    logs = {p.name for p in (out / "logs").iterdir()}
    assert logs == {f"{letter}{slot}.log" for slot, letter in enumerate("ABBA")}
    headline = next(f for f in summary["figures"] if f["figure"] == summary["headline"])
    assert headline["change"]["blocks"] == 2 and headline["change"]["df"] == 1  # 4 - 2 - 1
    assert not any(doubt.startswith("1 block with both arms") for doubt in summary["doubts"])
    assert [c["first_block"] for c in manifest_["calls"]] == [0, 1]
    before = (out / "manifest.json").read_bytes()
    for other, says in (({"c": "8"}, "concurrency"), ({"b": "engine.mixing=true"}, "arms.B")):
        refused = call("--continue", **other)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
    assert (out / "manifest.json").read_bytes() == before
    assert len(load_run(out)[1]["servers"]) == 4
