"""INVARIANTS 55: a stall at a server's start (harness/analysis/stalls.py), on synthetic frames
whose start delays are set by construction; and the doubt it gives a comparison and a
measurement."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

from harness.analysis.compare import compare
from harness.analysis.measurement import measure
from harness.analysis.schema import RequestRecord, ServerRecord, Slot
from harness.analysis.stalls import STALL_FLOOR_S, StartStall, start_delays, start_stalls

C, REQUESTS, WARMUP, TTFT, TOKENS = 4, 12, 4, 0.02, 5
LABELS = {"A": "off", "B": "on"}


def run(stalls: list[float], steady_start: float | None = None, order: str = "ABBA"):
    """Requests and servers of closed-loop servers of C lanes; server i's first C requests
    (all sent at once, warmup first) get their first token after `stalls[i]` seconds (0: the
    usual TTFT), every later request after TTFT. Each steady window opens at `steady_start`
    (default: the server's last warmup end)."""
    requests, servers = [], []
    for i, stall in enumerate(stalls):
        letter = order[i % len(order)]
        where = Slot(LABELS[letter], letter, f"{letter}{i}", i // len(order), i)
        sends = [0.001 * lane for lane in range(C)]
        ends = []
        for index in range(REQUESTS):
            send = sends.pop(0)
            first = send + (max(stall - send, TTFT) if index < C else TTFT)
            times = [first + 0.01 * k for k in range(TOKENS)]
            ends.append(times[-1])
            sends.append(times[-1])
            sends.sort()
            facts = {"index": index, "warmup": index < WARMUP, "prompt_tokens": 8}
            got = {"first_token_s": first, "end_s": times[-1], "output_tokens": TOKENS}
            requests.append(
                RequestRecord(
                    **asdict(where), **facts, max_tokens=TOKENS, intended_send_s=send,
                    send_s=send, token_times_s=times, status=200, **got,
                )
            )  # fmt: skip
        opens = max(ends[:WARMUP]) if steady_start is None else steady_start
        window = {"steady_start_s": opens, "steady_end_s": max(ends) - 0.05}
        facts = {"port": 8000 + i, "log": f"logs/{where.server}.log", "healthy": True}
        servers.append(
            ServerRecord(**asdict(where), **facts, **window, t0_unix=0.0, start_unix=0.0)
        )
    return (pd.DataFrame([asdict(r) for r in rows]) for rows in (requests, servers))


def test_a_server_stalled_at_its_start_is_found_with_what_it_holds():
    """Known answer: A0's first token came 103.8 s after its first send, the others' after
    the TTFT; its C first requests (C - WARMUP of them measured, here 0) waited through it,
    and its steady window opens after it."""
    requests, servers = run([103.8, 0, 0, 0])
    delays = start_delays(requests)
    assert delays["A0"] == pytest.approx(103.8)
    assert delays.drop("A0").to_numpy() == pytest.approx([TTFT] * 3)
    (stall,) = start_stalls(requests, servers)
    assert stall == StartStall("A0", pytest.approx(103.8), pytest.approx((TTFT, TTFT)), 0, True)


def test_measured_requests_that_waited_through_it_are_counted():
    requests, servers = run([50.0, 0, 0, 0])
    requests.loc[requests["index"] >= 2, "warmup"] = False  # 2 warmup requests, not C
    (stall,) = start_stalls(requests, servers)
    assert stall.measured == C - 2


def test_a_steady_window_open_during_the_stall_or_none_is_said():
    requests, servers = run([60.0, 0, 0, 0], steady_start=0.0)
    assert start_stalls(requests, servers)[0].steady_after is False
    servers.loc[0, ["steady_start_s", "steady_end_s"]] = np.nan
    assert start_stalls(requests, servers)[0].steady_after is None


@pytest.mark.parametrize(
    "delays",
    [
        [STALL_FLOOR_S - 1, 0, 0, 0],  # under the floor, however far above the others
        [15.0, 2.0, 2.0, 2.0],  # above the floor, under STALL_FACTOR times the others'
        [100.0, 100.0, 100.0, 100.0],  # every server alike: none stands out of the others
    ],
)
def test_no_stall_below_the_floor_or_the_others_multiple(delays):
    requests, servers = run(delays)
    assert start_stalls(requests, servers) == []


def test_a_lone_server_is_held_to_the_floor_alone():
    requests, servers = run([30.0], order="A")
    (stall,) = start_stalls(requests, servers)
    assert stall.server == "A0" and stall.others_s is None
    requests, servers = run([STALL_FLOOR_S - 1], order="A")
    assert start_stalls(requests, servers) == []


def test_a_server_with_no_first_token_is_left_out():
    requests, servers = run([80.0, 0, 0, 0])
    failed = requests["server"] == "B1"
    requests.loc[failed, ["first_token_s", "status"]] = [None, 0]
    assert "B1" not in start_delays(requests)
    assert [s.server for s in start_stalls(requests, servers)] == ["A0"]
    assert start_stalls(requests.iloc[:0], servers) == []


def test_the_comparison_and_the_measurement_say_it_in_one_line_a_server():
    """Two servers stalled (as in `bench compare` of a run against itself): each has its own
    line, and the range quoted is the servers' that did not stall."""
    requests, servers = run([103.8, 0.1, 0.05, 0, 90.0, 0, 0, 0])
    requests.loc[requests["index"] == C - 1, "warmup"] = False  # one measured request waits
    result = compare(requests, None, servers, LABELS)
    lines = [d for d in result.doubts if "stall at start" in d]
    assert lines == [
        f"server {name}: no first token for {delay} s after its first request (the servers that"
        " did not stall: 0.02-0.1 s): a stall at start (JIT compiles? a cold cache?); the TTFT"
        " of 1 measured request and its whole-load figures include it, its steady window does"
        " not: read the steady figures"
        for name, delay in (("A0", "103.8"), ("A4", "90.0"))
    ]
    alone = requests[requests["server"] == "A0"], servers[servers["server"] == "A0"]
    measured = measure(alone[0], None, alone[1], "off", {})
    (line,) = [d for d in measured.doubts if "stall at start" in d]
    assert "(no other server to compare)" in line
