"""Goodput, as vLLM's `bench serve --goodput` defines it (docs/METRICS.md): a completed request
is good when it meets every service-level objective given (TTFT, TPOT, E2E, each a limit in
ms); goodput is the good requests per second of load, and their share of the measured
requests. Pure functions over the requests frame."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.analysis import metrics

SLO_METRICS = {"ttft": metrics.ttft_s, "tpot": metrics.tpot_s, "e2e": metrics.e2e_s}
ALIASES = {"e2el": "e2e"}  # vLLM's name for end-to-end latency


@dataclass(frozen=True)
class Goodput:
    slos_ms: dict[str, float]
    good: int  # completed requests within every SLO
    measured: int  # measured requests (failed ones are never good)
    share: float | None  # good / measured
    per_s: float | None  # good requests per second of load (`goodput`)


def parse_slos(text: str) -> dict[str, float]:
    """`ttft:200,tpot:50,e2e:2000` -> {"ttft": 200.0, ...} (ms). Raises ValueError."""
    slos = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition(":")
        name = ALIASES.get(name.strip().lower(), name.strip().lower())
        if not sep or name not in SLO_METRICS:
            raise ValueError(
                f"--goodput {item!r}: give METRIC:MS with METRIC one of ttft, tpot, e2e"
            )
        try:
            limit = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: {value!r} is not a number of ms") from None
        if not limit > 0:
            raise ValueError(f"--goodput {item!r}: the limit must be > 0 ms")
        slos[name] = limit
    if not slos:
        raise ValueError("--goodput needs at least one METRIC:MS, e.g. ttft:200")
    return slos


def good(requests: pd.DataFrame, slos_ms: dict[str, float]) -> pd.Series:
    """For each completed request: within every SLO. An undefined value (TPOT of a one-token
    reply) meets its SLO, as vLLM counts it 0."""
    done = metrics.completed(requests)
    within = pd.Series(True, index=done.index)
    for name, limit in slos_ms.items():
        values = np.asarray(SLO_METRICS[name](done), dtype=float) * 1e3
        within &= ~(values > limit)  # NaN compares False: it meets the SLO
    return within


def goodput(requests: pd.DataFrame, slos_ms: dict[str, float]) -> Goodput:
    """The good requests, their share of the measured ones, and their rate: the share of
    completed requests that are good times the whole load's completed requests per second
    (`metrics.run_request_per_s`), so goodput equals that rate when every request is good."""
    measured = len(metrics.measured(requests))
    completed = len(metrics.completed(requests))
    count = int(good(requests, slos_ms).sum())
    rate = metrics.run_request_per_s(requests)
    return Goodput(
        dict(slos_ms),
        count,
        measured,
        count / measured if measured else None,
        count / completed * rate if completed and rate == rate else None,
    )
