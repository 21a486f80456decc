"""How the report's plots look, and the one module that imports matplotlib (Agg: no display).

Figures are 9 in wide at 150 dpi (1350 px): GitHub shows them about 900 px wide, where 10 pt
text stays legible.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

WIDTH_IN, DPI = 9.0, 150
COLORS = {"A": "#0072B2", "B": "#E69F00"}  # Okabe-Ito blue and orange: safe for colour blindness
NEUTRAL = "0.65"
# distinct colours for stacked parts: tab10 without its grey (kept for NEUTRAL), then tab20b
PALETTE = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 7] + list(
    plt.get_cmap("tab20b").colors
)
RC = {"font.size": 10, "axes.titlesize": 11, "axes.spines.top": False, "axes.spines.right": False}


def context():
    """The report's look, for the figures made inside (matplotlib's globals stay untouched)."""
    return plt.rc_context(RC)


def subplots(rows: int, cols: int, height_in: float, **kwargs):
    return plt.subplots(
        rows, cols, figsize=(WIDTH_IN, height_in), layout="constrained", squeeze=False, **kwargs
    )


def save(figure, path: Path) -> None:
    figure.savefig(path, dpi=DPI)
    plt.close(figure)


def note(ax, text: str, y: float, dy: float = 2) -> None:
    """Small grey text at the left edge of the axes, at data height `y`."""
    ax.annotate(
        text,
        (0, y),
        xycoords=("axes fraction", "data"),
        xytext=(2, dy),
        textcoords="offset points",
        fontsize=8,
        color="0.4",
    )


def finite(value: float | None) -> float:
    """The value, or 0 where there is none (a bar of no length)."""
    return value if value is not None and math.isfinite(value) else 0.0


def short(text: str, width: int = 24) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
