"""The micro-benchmarks' summary of their samples: the median and the deciles p10 and p90, by
one rule, and the one way they are shown.

The rule is numpy's default quantile, as the harness's latency percentiles use
(harness/analysis/metrics.py): linear interpolation between order statistics (Hyndman and
Fan's type 7). The q-quantile of n sorted samples x[0] <= ... <= x[n-1] is x at h = q (n - 1),
between x[floor(h)] and x[ceil(h)]. It needs no minimum count: one sample is its own median,
p10 and p90; two give p10 = x[0] + 0.1 (x[1] - x[0]). No samples give no summary (None),
never a zero or an exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    median: float
    p10: float
    p90: float
    n: int  # the samples summarised


def summarise(samples: Sequence[float]) -> Summary | None:
    """The samples' median, p10 and p90 (linear interpolation); None for no samples."""
    if len(samples) == 0:
        return None
    median, p10, p90 = np.quantile(np.asarray(samples, dtype=float), [0.5, 0.1, 0.9]).tolist()
    return Summary(median, p10, p90, len(samples))


def render(summary: Summary, unit: str = "ms") -> str:
    """`median 1.250 ms (p10 1.100, p90 1.600)`: every benchmark's line shows it so."""
    return f"median {summary.median:.3f} {unit} (p10 {summary.p10:.3f}, p90 {summary.p90:.3f})"
