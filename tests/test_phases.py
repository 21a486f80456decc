"""Span analysis on synthetic windows whose ms per iteration and per request are known."""

from __future__ import annotations

from dataclasses import asdict

import pandas as pd
import pytest

from harness.analysis import phases
from harness.analysis.schema import SpanRecord

MS = 1e6  # ns per ms


def span(name: str, ms: float, n: int, window: tuple[int, int], slot: int = 0, **kw) -> SpanRecord:
    first, last = window
    where = {"arm": "main", "letter": "A", "server": f"A{slot}", "block": 0, "slot": slot}
    iterations = {"first_iter": first, "last_iter": last, "iterations": last - first + 1}
    values = {"n": n, "sum": ms * MS, "p50": 0.0, "p95": 0.0, "max": 0.0}
    fields = where | iterations | values | {"name": name, "kind": "span", "mean_batch": 32.0}
    return SpanRecord(**(fields | kw))


def frame(records) -> pd.DataFrame:
    return pd.DataFrame([asdict(r) for r in records])


W1, W2, W3 = (1, 100), (101, 200), (1, 300)
SPANS = frame(
    [
        # slot 0: two windows, 200 iterations
        span("worker.iter_total", 300.0, 100, W1),
        span("worker.iter_total", 320.0, 100, W2),
        span("worker.postprocess_batch", 80.0, 100, W1),
        span("worker.postprocess_batch", 84.0, 100, W2),
        span("worker.step.completion_wait", 20.0, 100, W1),
        span("worker.step.completion_wait", 24.0, 100, W2),
        span("worker.postprocess.prematerialize", 10.0, 100, W1),  # none in W2
        span("worker.msg.add_request", 30.0, 40, W1),
        span("worker.msg.add_request.read_prompt", 12.0, 40, W1),
        span("worker.msg.add_request.engine", 10.0, 40, W1),
        span("worker.msg.remove_request", 16.0, 40, W2),
        span("worker.msg.abort", 2.0, 2, W2),
        span("worker.rows_per_step", 0.0, 100, W1, kind="count", sum=3000.0),
        span("worker.rows_per_step", 0.0, 100, W2, kind="count", sum=1000.0),
        # slot 1: one window of 300 iterations
        span("worker.iter_total", 600.0, 300, W3, slot=1),
        span("worker.postprocess_batch", 150.0, 300, W3, slot=1),
        span("worker.step.completion_wait", 30.0, 300, W3, slot=1),
        span("worker.postprocess.prematerialize", 15.0, 300, W3, slot=1),
        span("worker.msg.add_request", 50.0, 60, W3, slot=1),
    ]
)


def by_name(table: pd.DataFrame, value: str, **keys) -> dict[str, float]:
    rows = table
    for key, wanted in keys.items():
        rows = rows[rows[key] == wanted]
    return dict(zip(rows["name"], rows[value], strict=True))


def test_iterations_count_each_window_once():
    assert phases.iterations(SPANS).tolist() == [200, 300]
    assert phases.iterations(SPANS, phases.BY_ARM).tolist() == [500]


def test_ms_per_iteration_per_server():
    slot0 = by_name(phases.ms_per_iteration(SPANS), "ms_per_iter", slot=0)
    assert slot0["worker.iter_total"] == pytest.approx(620 / 200)
    # prematerialize had samples in one window only: still divided by all 200 iterations
    assert slot0["worker.postprocess.prematerialize"] == pytest.approx(10 / 200)
    assert "worker.rows_per_step" not in slot0  # a count, not a span


def test_postprocess_work_subtracts_the_waits():
    table = phases.phase_table(SPANS)
    slot0 = by_name(table, "ms_per_iter", slot=0)
    slot1 = by_name(table, "ms_per_iter", slot=1)
    assert slot0[phases.POSTPROCESS_WORK] == pytest.approx((164 - 44 - 10) / 200)
    assert slot1[phases.POSTPROCESS_WORK] == pytest.approx((150 - 30 - 15) / 300)
    only_copy = phases.phase_table(SPANS, waits=("worker.postprocess.prematerialize",))
    assert by_name(only_copy, "ms_per_iter", slot=0)[phases.POSTPROCESS_WORK] == pytest.approx(
        (164 - 10) / 200
    )


def test_arm_pooled_is_sum_over_sum_not_mean_of_servers():
    pooled = by_name(phases.phase_table(SPANS, phases.BY_ARM), "ms_per_iter")
    assert pooled[phases.POSTPROCESS_WORK] == pytest.approx((110 + 105) / 500)
    assert pooled["worker.iter_total"] == pytest.approx(1220 / 500)


def test_message_cost_per_request_with_stage_laps():
    costs = by_name(phases.message_costs(SPANS), "ms_per_request", slot=0)
    assert costs["worker.msg.add_request"] == pytest.approx(30 / 40)
    assert costs["worker.msg.add_request.read_prompt"] == pytest.approx(12 / 40)
    assert costs["worker.msg.remove_request"] == pytest.approx(16 / 40)
    # the total adds the messages received, not their laps (which are inside them) nor the
    # request removal (inside the postprocess's tail, or inside the abort message)
    assert costs[phases.ALL_MESSAGES] == pytest.approx((30 + 2) / 40)
    pooled = by_name(phases.message_costs(SPANS, phases.BY_ARM), "ms_per_request")
    assert pooled["worker.msg.add_request"] == pytest.approx(80 / 100)


def test_only_messages_received_are_messages():
    assert phases.is_message("worker.msg.add_request") and phases.is_message("worker.msg.abort")
    assert not phases.is_message("worker.msg.remove_request")
    assert not phases.is_message("worker.msg.add_request.engine")
    assert not phases.is_message(phases.ALL_MESSAGES)


def test_message_parent():
    assert phases.message_parent("worker.msg.add_request.engine") == "worker.msg.add_request"
    assert phases.message_parent("worker.msg.add_request") is None
    assert phases.message_parent(phases.ALL_MESSAGES) is None


def test_count_means():
    means = by_name(phases.count_means(SPANS), "mean", slot=0)
    assert means["worker.rows_per_step"] == pytest.approx(4000 / 200)


def test_missing_spans_give_empty_tables():
    empty = SPANS.iloc[:0]
    assert phases.phase_table(empty).empty
    assert phases.message_costs(empty).empty
    no_postprocess = SPANS[SPANS["name"] != phases.POSTPROCESS]
    assert phases.POSTPROCESS_WORK not in set(phases.phase_table(no_postprocess)["name"])
    no_adds = SPANS[SPANS["name"] != "worker.msg.add_request"]
    assert phases.message_costs(no_adds).empty  # no requests, no per-request cost
