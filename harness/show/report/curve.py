"""The throughput-latency curve of a sweep (sweep.png): throughput against the offered load,
and latency against throughput, the saturation point marked."""

from __future__ import annotations

from pathlib import Path

from harness.analysis.sweep import Sweep
from harness.show.report import style
from harness.show.report.style import COLORS


def draw_sweep(sweep: Sweep, path: Path) -> Path:
    unit = "req/s offered" if sweep.axis == "rate" else "requests in flight"
    with style.context():
        figure, axes = style.subplots(1, 2, 3.6)
        left, right = axes[0]
        loads = sorted({p.load for p in sweep.points})
        for letter, label in sweep.labels.items():
            points = [p for p in sweep.points if p.letter == letter]
            tput = [_nan(p.output_tok_per_s) for p in points]
            color = COLORS[letter]
            name = f"{letter}: {label}" if len(sweep.labels) > 1 else "output tok/s"
            left.plot([p.load for p in points], tput, "o-", color=color, label=name)
            for metric, line in (("ttft_p99_ms", "o--"), ("tpot_p50_ms", "s-")):
                values = [_nan(p.latency_ms.get(metric)) for p in points]
                right.plot(tput, values, line, color=color, label=f"{letter} {metric[:-3]}")
            at = sweep.saturation.get(letter)
            if at is not None:
                left.axvline(at, color=color, ls=":", lw=1)
        left.set_xlabel(unit)
        if loads and loads[-1] >= 8 * loads[0]:
            left.set_xscale("log")
        left.set_ylabel("output tok/s (steady)")
        left.set_title("Throughput against load (dotted: saturation)")
        left.legend(fontsize=8, frameon=False)
        right.set_xlabel("output tok/s (steady)")
        right.set_ylabel("ms")
        right.set_yscale("log")
        right.set_title("Latency against throughput")
        right.legend(fontsize=8, frameon=False)
        style.save(figure, path)
    return path


def _nan(value: float | None) -> float:
    """A value to plot; an undefined one leaves a gap rather than a point at zero."""
    return float("nan") if value is None else float(value)
