"""Phase timing: with the flag on the records have the documented schema and their counts
match the iterations run; with it off nothing is emitted (INVARIANTS 8)."""

from __future__ import annotations

import msgspec

from engine.config import load_scenario
from engine.messages import AddRequest, StepFrames
from engine.spans import SpanWindowRecord
from engine.worker.main import build_worker
from engine.worker.timing import PhaseTimer

SCHEMA = {
    "server": str, "name": str, "kind": str, "first_iter": int, "last_iter": int,
    "iterations": int, "mean_batch": float, "n": int, "sum": float, "p50": float, "p95": float,
    "max": float, "start_unix": float, "end_unix": float,
}  # fmt: skip


def run_worker(period: int, requests: int = 6, max_tokens: int = 9):
    scenario = load_scenario("qwen35", "tiny")
    emitted: list[list[SpanWindowRecord]] = []
    frames: list[StepFrames] = []
    timer = PhaseTimer(period, "t", [emitted.append])
    worker = build_worker(scenario.model, scenario.engine, timer, frames.append)
    for rid in range(requests):
        worker.handle(
            AddRequest(rid, [rid + 1] * (3 + rid), max_tokens, ignore_eos=True, temperature=0)
        )
    iterations = 0
    while worker.iteration():
        iterations += 1
    timer.flush()
    return emitted, frames, iterations


def test_records_have_the_schema_and_count_the_iterations():
    emitted, frames, iterations = run_worker(period=4)
    records = [r for window in emitted for r in window]
    assert records
    for record in records:
        row = msgspec.structs.asdict(record)
        assert set(row) == set(SCHEMA)
        for key, kind in SCHEMA.items():
            assert isinstance(row[key], kind), key
        assert record.kind in ("span", "count")
        assert record.p50 <= record.p95 <= record.max
        assert record.iterations == record.last_iter - record.first_iter + 1
    totals = [r for r in records if r.name == "worker.iter_total"]
    assert sum(r.n for r in totals) == iterations
    assert sum(r.iterations for r in totals) == iterations
    assert all(r.iterations == 4 for r in totals[:-1])  # every full window is `period` long
    windows = sorted({(r.first_iter, r.last_iter) for r in records})
    assert windows[0][0] == 1 and windows[-1][1] == iterations
    assert all(b[0] == a[1] + 1 for a, b in zip(windows, windows[1:], strict=False))
    rows = sum(r.sum for r in records if r.name == "worker.rows_per_step")
    assert rows == sum(r.mean_batch * r.iterations for r in totals)
    adds = [r for r in records if r.name == "worker.msg.add_request"]
    assert sum(r.n for r in adds) == 6
    for stage in ("read_prompt", "engine", "runtime"):
        assert sum(r.n for r in records if r.name == f"worker.msg.add_request.{stage}") == 6
    removes = sum(r.n for r in records if r.name == "worker.msg.remove_request")
    assert removes == 6
    names = {r.name for r in records}
    for phase in ("prematerialize", "runtime", "check_stop", "send_prep", "tail"):
        assert f"worker.postprocess.{phase}" in names
    assert {
        "worker.postprocess_batch",
        "worker.step.forward",
        "worker.step.schedule",
        "worker.step.completion_wait",
    } <= names


def test_timing_off_emits_nothing_and_outputs_do_not_change():
    emitted_off, frames_off, iters_off = run_worker(period=0)
    emitted_on, frames_on, iters_on = run_worker(period=3)
    assert emitted_off == []
    assert iters_off == iters_on
    tokens = lambda frames: [(f.rid, f.tokens, f.finish_reason) for s in frames for f in s.frames]  # noqa: E731
    assert tokens(frames_off) == tokens(frames_on)
