"""Phase timing: with the flag on the records have the documented schema and their counts
match the iterations run; with it off nothing is emitted (INVARIANTS 8). The worker sends raw
windows and computes nothing from them; its own bookkeeping is a span of its own."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from engine import spans
from engine.messages import AddRequest, StepFrames
from engine.spans import SpanWindow, SpanWindowRecord, window_records
from engine.worker.main import build_worker
from engine.worker.timing import PhaseTimer
from harness.scenario import load_scenario

SCHEMA = {
    "server": str, "name": str, "kind": str, "first_iter": int, "last_iter": int,
    "iterations": int, "mean_batch": float, "n": int, "sum": float, "p50": float, "p95": float,
    "max": float, "start_unix": float, "end_unix": float,
}  # fmt: skip


def run_worker(period: int, requests: int = 6, max_tokens: int = 9):
    scenario = load_scenario("qwen35", "tiny")
    windows: list[SpanWindow] = []
    frames: list[StepFrames] = []
    timer = PhaseTimer(period, "t", [windows.append])
    worker = build_worker(scenario.model, scenario.engine, timer, frames.append)
    for rid in range(requests):
        worker.handle(
            AddRequest(rid, [rid + 1] * (3 + rid), max_tokens, ignore_eos=True, temperature=0)
        )
    iterations = 0
    while worker.iteration():
        iterations += 1
    timer.flush()
    emitted: list[list[SpanWindowRecord]] = [window_records(w) for w in windows]
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
    prefills = sum(r.sum for r in records if r.name == "worker.prefill_steps")
    prompt_rows = sum(r.sum for r in records if r.name == "worker.prefill_rows_per_step")
    assert (prefills, prompt_rows) == (1, 6)  # the six prompts in one step, then decode steps
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


def test_the_worker_computes_no_percentile(monkeypatch):
    """Defect 7: every window the worker computed percentiles, encoded and published on its
    critical path. Now it sends raw samples: a worker whose numpy cannot take a percentile
    still runs with timing on."""

    def refuse(*args, **kwargs):
        raise AssertionError("a percentile computed in the worker")

    monkeypatch.setattr(np, "percentile", refuse)
    scenario = load_scenario("qwen35", "tiny")
    windows: list[SpanWindow] = []
    timer = PhaseTimer(3, "t", [windows.append])
    worker = build_worker(scenario.model, scenario.engine, timer, lambda msg: None)
    worker.handle(AddRequest(0, [1, 2, 3], 9, ignore_eos=True, temperature=0))
    while worker.iteration():
        pass
    assert len(windows) >= 3
    monkeypatch.undo()
    first = window_records(windows[0])
    assert all(r.p50 <= r.p95 <= r.max for r in first)


def test_the_worker_times_its_own_bookkeeping():
    """Packing and sending a window is a span of its own, recorded in the window after."""
    emitted, _, iterations = run_worker(period=4)
    flushes = [r for window in emitted for r in window if r.name == spans.SPAN_FLUSH]
    assert [r.first_iter for r in flushes] == [w[0].first_iter for w in emitted[1:]]
    assert all(r.n == 1 and r.sum > 0 for r in flushes)


def test_a_window_becomes_one_record_per_name():
    window = SpanWindow(
        "A0", 11, 20, 30, 100.0, 101.0,
        {"worker.iter_total": spans.samples(list(range(1, 11)))},
        {"worker.rows_per_step": spans.samples([3] * 10)},
    )  # fmt: skip
    wire = spans.decode_window(spans.encode_window(window))
    (total, rows) = window_records(wire)
    assert (total.name, total.kind, total.n, total.sum, total.max) == (
        "worker.iter_total", "span", 10, 55.0, 10.0,
    )  # fmt: skip
    assert total.p50 == pytest.approx(5.5) and total.p95 == pytest.approx(9.55)
    assert (total.iterations, total.mean_batch) == (10, 3.0)
    assert (rows.kind, rows.sum, rows.first_iter, rows.end_unix) == ("count", 30.0, 11, 101.0)
