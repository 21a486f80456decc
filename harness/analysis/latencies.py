"""Latency distributions (docs/METRICS.md): each latency's samples over one server's completed
requests, inside its steady window, and their percentiles and mean in `<metric>_<stat>_ms`
columns. Pure functions over the requests frame (metrics.py defines each latency).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from harness.analysis.metrics import Window, completed, e2e_s, itl_s, rtf, tpot_s, ttft_s

QUANTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}
STATS = [*QUANTILES, "mean"]
LATENCIES = ["ttft", "tpot", "itl", "e2e"]
SPEECH_LATENCIES = ["ttfa", "e2e", "rtf"]  # a speech load's (RTF is a ratio, not a time)
RATIOS = {"rtf"}
NO_SAMPLES = np.empty(0)


def distribution(values: np.ndarray) -> dict[str, float]:
    """p50/p90/p99 (linear interpolation) and mean; NaN when there are no values."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if not values.size:
        return dict.fromkeys(STATS, float("nan"))
    quantiles = np.quantile(values, list(QUANTILES.values()))
    return {**dict(zip(QUANTILES, quantiles.tolist(), strict=True)), "mean": float(values.mean())}


def latency_samples(requests: pd.DataFrame, window: Window = None) -> dict[str, np.ndarray]:
    """Seconds of each latency over the completed requests given (one server's). With a
    steady window, only what happened inside it: TTFT, TPOT and E2E of the requests sent and
    ended inside it, and the ITL gaps whose two arrivals both lie inside it."""
    done = completed(requests)
    gaps = itl_s(done) if window is None else _gaps_inside(done, *window)
    whole = _inside(done, window)
    samples = {"ttft": ttft_s(whole), "tpot": tpot_s(whole), "itl": gaps, "e2e": e2e_s(whole)}
    return {metric: np.asarray(seconds, dtype=float) for metric, seconds in samples.items()}


def speech_samples(requests: pd.DataFrame, window: Window = None) -> dict[str, np.ndarray]:
    """A speech load's latencies over the completed requests given, as latency_samples: TTFA
    (a speech reply's TTFT: its first output is its first audio) and E2E in seconds, and RTF,
    of the requests sent and ended inside the steady window when there is one."""
    whole = _inside(completed(requests), window)
    samples = {"ttfa": ttft_s(whole), "e2e": e2e_s(whole), "rtf": rtf(whole)}
    return {metric: np.asarray(values, dtype=float) for metric, values in samples.items()}


def _inside(done: pd.DataFrame, window: Window) -> pd.DataFrame:
    """The requests sent and ended inside the window (all of them without one)."""
    if window is None:
        return done
    start, end = window
    return done[(done["send_s"] >= start) & (done["end_s"].astype(float) <= end)]


def _gaps_inside(requests: pd.DataFrame, start: float, end: float) -> np.ndarray:
    gaps = []
    for times in requests["token_times_s"]:
        t = np.asarray(times, dtype=float)
        t = t[(t >= start) & (t <= end)]
        gaps.append(np.diff(t))
    return np.concatenate(gaps) if gaps else np.empty(0)


def latency_ms(samples: Mapping[str, np.ndarray]) -> dict[str, float]:
    """`<metric>_<stat>_ms` for each latency's samples (seconds); `<metric>_<stat>` for a
    ratio's (RATIOS: RTF)."""
    out = {}
    for metric, values in samples.items():
        if metric in RATIOS:
            out |= {f"{metric}_{stat}": v for stat, v in distribution(values).items()}
            continue
        for stat, value in distribution(values * 1e3).items():
            out[f"{metric}_{stat}_ms"] = value
    return out
