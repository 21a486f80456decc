"""The span collector takes a server's windows when its worker says the last one went: no
sleep, no window left behind, and a bounded wait for a worker that never says so."""

from __future__ import annotations

import time
from dataclasses import fields

import pytest
import zmq

from engine.spans import RECORDS_TOPIC, SpanWindow, SpanWindowRecord, encode, samples
from engine.worker.timing import SpanPublisher
from harness.analysis.schema import Slot, SpanRecord
from harness.measure.spans import SpanCollector

A0, B1 = Slot("main", "A", "A0", 0, 0), Slot("pr", "B", "B1", 0, 1)


def window(server: str, first: int) -> SpanWindow:
    """Ten iterations of 0.1 ms each."""
    iter_total = {"worker.iter_total": samples([100_000] * 10)}
    return SpanWindow(server, first, first + 9, 20, 100.0, 101.0, iter_total, {})


@pytest.fixture
def collector():
    collector = SpanCollector()
    yield collector
    collector.close()


@pytest.fixture
def publishers(collector):
    ctx = zmq.Context()
    made = []

    def make(server: str) -> SpanPublisher:
        made.append(SpanPublisher(ctx, collector.address, server))
        time.sleep(0.3)  # PUB/SUB: the subscription reaches a new publisher before it sends
        return made[-1]

    yield make
    ctx.destroy(linger=0)


def test_windows_are_taken_once_the_end_message_is_in(collector, publishers):
    a0, b1 = publishers("A0"), publishers("B1")
    for first in (1, 11, 21):
        a0.publish(window("A0", first))
    b1.publish(window("B1", 1))
    a0.end()
    start = time.monotonic()
    taken = collector.take(A0, wait_s=10.0)
    assert time.monotonic() - start < 2.0  # the end message, not the wait, ended it
    assert [r.first_iter for r in taken] == [1, 11, 21]
    assert {(r.arm, r.letter, r.server, r.block, r.slot) for r in taken} == {
        ("main", "A", "A0", 0, 0)
    }
    assert collector.take(A0) == []  # taken once
    b1.end()
    assert [r.server for r in collector.take(B1, wait_s=10.0)] == ["B1"]


def test_a_worker_that_never_ends_costs_the_wait_and_keeps_its_windows(collector, publishers):
    publishers("A0").publish(window("A0", 1))
    time.sleep(0.3)
    start = time.monotonic()
    taken = collector.take(A0, wait_s=0.5)
    assert 0.5 <= time.monotonic() - start < 2.0
    assert len(taken) == 1


def test_a_span_row_is_the_wire_record_with_its_slot():
    """The stored row is declared apart from the wire record (the results schema has its own
    version); this holds the two together."""
    row = {f.name for f in fields(SpanRecord)}
    assert row == {f.name for f in fields(Slot)} | set(SpanWindowRecord.__struct_fields__)


def test_records_of_an_engine_older_than_windows_are_still_read(collector, publishers):
    """Arm A of a run is often an older commit: its worker publishes records, not windows."""
    old = publishers("A0")
    sums = {"n": 10, "sum": 1e6, "p50": 1e5, "p95": 2e5, "max": 3e5}
    times = {"start_unix": 100.0, "end_unix": 101.0}
    record = SpanWindowRecord("A0", "worker.iter_total", "span", 1, 10, 10, 2.0, **sums, **times)
    old.socket.send_multipart([RECORDS_TOPIC, encode([record])])
    old.publish(window("A0", 11))
    old.end()
    taken = collector.take(A0, wait_s=10.0)
    assert [(r.first_iter, r.n, r.sum) for r in taken] == [(1, 10, 1e6), (11, 10, 1e6)]
    assert taken[1].p50 == 1e5 and taken[1].mean_batch == 2.0


def test_an_untimed_arm_runs_its_servers_without_phase_timing(collector):
    """scripts/timing_cost.py compares timing on (A) against off (B) on one tree."""
    from engine import env
    from harness.measure.run_plan import RunPlan
    from harness.measure.slot import server_timing

    plan = RunPlan(None, {}, list("ABBA"), 4, 4, [], 0, 50, untimed=("B",))
    on, off = server_timing(plan, "A", collector), server_timing(plan, "B", collector)
    assert on[env.PHASE_TIMING.name] == "50" and on[env.SPAN_ADDR.name] == collector.address
    assert off.get(env.PHASE_TIMING.name, "0") == "0" and not off.get(env.SPAN_ADDR.name)
