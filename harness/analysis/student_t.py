"""Student's t: the quantile of a two-sided interval, exact for integer degrees of freedom."""

from __future__ import annotations

import math


def t_quantile(level: float, df: int) -> float:
    """t such that P(|T| < t) = level for Student's t with integer `df` (bisection)."""
    low, high = 0.0, 1.0
    while _t_central_mass(high, df) < level:
        high *= 2.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_central_mass(mid, df) < level else (low, mid)
    return (low + high) / 2


def _t_central_mass(t: float, df: int) -> float:
    """P(|T| < t), exact for integer df (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    power, term, total = (1, math.cos(theta), 0.0) if df % 2 else (0, 1.0, 0.0)
    while power <= df - 2:
        total += term
        term *= (power + 1) / (power + 2) * c2
        power += 2
    if df % 2:
        return 2 / math.pi * (theta + math.sin(theta) * total)
    return math.sin(theta) * total
