"""How a number reads, the same in the terminal and in the report."""

from __future__ import annotations

import math

from harness.analysis.stats import WITHIN_BLOCK, Change


def number(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}"


def joined(values: list, show=number) -> str:
    """Per-server values in schedule order: `20463 / 20457`."""
    return " / ".join(show(v) for v in values) or "-"


def change_text(change: Change) -> str:
    if change.ratio is None:
        return "-"
    low = (change.low - 1) * 100  # compact, for 80 columns: +4.5% (-7.5..+18.0%)
    return f"{change.ratio - 1:+.1%} ({low:+.1f}..{change.high - 1:+.1%})"


def verdict_text(change: Change) -> str:
    weaker = " (1 block)" if change.method == WITHIN_BLOCK else ""
    return change.verdict + weaker


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def significant(value: float | None) -> str:
    """Three significant digits."""
    return "-" if value is None else f"{value:.3g}"
