"""The throughput-latency curve of a sweep (sweep.png): throughput against the offered load,
and latency against throughput, the saturation point marked."""

from __future__ import annotations

from pathlib import Path

from harness.analysis.sweep import Sweep
from harness.show.report import style
from harness.show.report.style import COLORS


def draw_sweep(sweep: Sweep, path: Path) -> Path:
    unit = "req/s offered" if sweep.axis == "rate" else "requests in flight"
    loads = [p.load for p in sweep.points]
    tput = [_nan(p.output_tok_per_s) for p in sweep.points]
    with style.context():
        figure, axes = style.subplots(1, 2, 3.6)
        left, right = axes[0]
        left.plot(loads, tput, "o-", color=COLORS["A"])
        left.set_xlabel(unit)
        if loads[-1] >= 8 * loads[0]:
            left.set_xscale("log")
        left.set_ylabel("output tok/s (steady)")
        left.set_title("Throughput against load")
        for name, style_, color in (
            ("ttft_p50_ms", "o-", COLORS["A"]),
            ("ttft_p99_ms", "o--", COLORS["A"]),
            ("tpot_p50_ms", "s-", COLORS["B"]),
            ("tpot_p99_ms", "s--", COLORS["B"]),
        ):
            values = [_nan(p.latency_ms.get(name)) for p in sweep.points]
            right.plot(tput, values, style_, color=color, label=name.removesuffix("_ms"))
        right.set_xlabel("output tok/s (steady)")
        right.set_ylabel("ms")
        right.set_yscale("log")
        right.set_title("Latency against throughput")
        right.legend(fontsize=8, frameon=False)
        if sweep.saturation is not None:
            at = loads.index(sweep.saturation)
            left.axvline(sweep.saturation, color=style.NEUTRAL, ls=":", label="saturation")
            right.axvline(tput[at], color=style.NEUTRAL, ls=":")
            left.legend(fontsize=8, frameon=False)
        style.save(figure, path)
    return path


def _nan(value: float | None) -> float:
    """A value to plot; an undefined one leaves a gap rather than a point at zero."""
    return float("nan") if value is None else float(value)
