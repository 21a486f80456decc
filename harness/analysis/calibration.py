"""What `bench calibrate` found: the load generator's error against a mock whose timing is
set, and the most tokens per second the client reads (docs/LOADGEN.md). Pure functions over
the closed loop's records and the mock's own per-request times.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.analysis.schema import RequestRecord
from harness.errors import BenchError

TARGETS = {"ttft_error_p50_ms": 1.0, "ttft_error_p99_ms": 5.0, "tokens_per_s_one_core": 50_000}
QUIET_CORES = 0.25  # CPU other processes may use during calibration before it is doubtful


def percentiles(values: np.ndarray) -> dict:
    if values.size == 0:
        raise BenchError("no steady-state requests to calibrate on; raise --duration")
    p50, p99 = np.percentile(values, [50, 99])
    return {"p50": float(p50), "p99": float(p99), "mean": float(values.mean()), "n": values.size}


def latency_errors(
    steady: Sequence[RequestRecord],
    mock_times: dict[str, tuple[float, float]],
    ttft_ms: float,
    itl_ms: float,
) -> dict:
    """TTFT and ITL measured less set, in ms, over the steady requests; TTFT's error split into
    client send -> mock read, the mock's own lateness, mock write -> client read, for the
    requests the mock reported (`mock_times`: request id -> arrival and first write, on the
    load's clock)."""
    joined = [(r, *mock_times[str(r.index)]) for r in steady if str(r.index) in mock_times]
    ttft = np.array([r.first_token_s - r.send_s for r in steady]) * 1e3
    itl = np.concatenate([np.diff(r.token_times_s) for r in steady]) * 1e3
    return {
        "ttft_error_ms": percentiles(ttft - ttft_ms),
        "to_mock_ms": percentiles(np.array([arr - r.send_s for r, arr, _ in joined]) * 1e3),
        "mock_ttft_error_ms": percentiles(
            np.array([f - arr for _, arr, f in joined]) * 1e3 - ttft_ms
        ),
        "to_client_ms": percentiles(np.array([r.first_token_s - f for r, _, f in joined]) * 1e3),
        "itl_error_ms": percentiles(itl - itl_ms),
        "send_lag_ms": percentiles(np.array([r.send_s - r.intended_send_s for r in steady]) * 1e3),
    }


def load_figures(
    records: Sequence[RequestRecord],
    window: tuple[float, float],
    client_cpu_s: float,
    mock_cpu_s: float,
    others_cpu_s: float,
    wall_s: float,
) -> dict:
    """Tokens per second read in the steady `window`, and the CPU the client, the mock and
    everything else used per second of the load."""
    a, b = window
    times = np.concatenate([r.token_times_s for r in records] or [[]])
    elapsed = max(r.end_s for r in records)
    failures = [r for r in records if not r.ok and r.error != "interrupted"]
    return {
        "requests": len(records),
        "failures": len(failures),
        "first_failure": failures[0].error if failures else None,
        "steady_s": b - a,
        "tokens_per_s": float(((times >= a) & (times <= b)).sum() / (b - a)),
        "client_cores": client_cpu_s / elapsed,
        "client_cpu_us_per_token": client_cpu_s / max(times.size, 1) * 1e6,
        # what one client process could read at this run's tokens per read, were CPU the limit
        "tokens_per_s_per_core": times.size / client_cpu_s,
        "mock_cores": mock_cpu_s / elapsed,
        "other_cores": max(0.0, others_cpu_s) / wall_s,
    }


def verdict(latency: dict, throughput: dict, one_client_process: bool) -> tuple[dict, str | None]:
    """Which targets were met, and why the result is doubtful (None when it is not)."""
    met = {
        "ttft_error_p50": latency["ttft_error_ms"]["p50"] <= TARGETS["ttft_error_p50_ms"],
        "ttft_error_p99": latency["ttft_error_ms"]["p99"] <= TARGETS["ttft_error_p99_ms"],
        "tokens_per_s_one_core": one_client_process
        and throughput["tokens_per_s"] >= TARGETS["tokens_per_s_one_core"],
        "no_failures": latency["failures"] == throughput["failures"] == 0,
    }
    others = max(latency["other_cores"], throughput["other_cores"])
    doubt = None
    if others > QUIET_CORES:
        doubt = f"other processes used {others:.2f} cores meanwhile; rerun on a quiet machine"
    return met, doubt
