"""`bench calibrate` finishes in bounded time (issue 11, defect 12): a lane cancelled as its
response completes stops, and the flat-out phase ends by time, not by the client's pace."""

from __future__ import annotations

import asyncio
import time

import pytest

from harness.measure.calibrate import Settings, _throughput, calibrate
from harness.measure.event_loop import run_loop
from harness.measure.http_client import Connection, Endpoint, Lane


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def test_a_lane_cancelled_as_its_response_completes_is_cancelled():
    """asyncio.wait_for before Python 3.12 returned the result and lost the cancellation when
    the two met; flat out, responses complete all the time, so a lane of the closed loop
    ran on past its stop (through all 256,000 requests of the calibration's sequence)."""

    async def main() -> str:
        lane = Lane(Endpoint("http://127.0.0.1:9/v1/completions"))
        lane.conn = Connection()
        lane.conn.transport = _Transport()
        task = asyncio.ensure_future(lane.post(b"{}", b"", lambda *_: None, 5.0))
        for _ in range(3):
            await asyncio.sleep(0)
        lane.conn.done.set_result(200)  # the response completes ...
        task.cancel()  # ... as the load is stopped
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "ran on"

    assert run_loop(main()) == "cancelled"


@pytest.mark.slow
def test_the_flat_out_phase_ends_by_time():
    settings = Settings(concurrency=64, output_tokens=256, duration_s=2.0)
    start = time.monotonic()
    out = run_loop(_throughput(settings))
    assert time.monotonic() - start < settings.duration_s + 20
    assert out["failures"] == 0 and out["tokens_per_s"] > 0


@pytest.mark.slow
def test_calibrate_at_a_small_size_finishes_in_bounded_time():
    """What CI runs: C=8, 64 tokens, 2 s a phase (about 15 s on 2 busy cores)."""
    start = time.monotonic()
    result = calibrate(Settings(concurrency=8, output_tokens=64, duration_s=2.0))
    assert time.monotonic() - start < 60
    assert result["latency"]["failures"] == result["throughput"]["failures"] == 0
