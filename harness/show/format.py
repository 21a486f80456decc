"""How a number, a change, a verdict and a comparison's caption read, the same in the terminal
and in the report."""

from __future__ import annotations

import math

from engine.spans import NOT_MESSAGES
from harness.analysis.block_model import MIN_BLOCKS
from harness.analysis.comparison import Comparison
from harness.analysis.phases import ALL_MESSAGES, POSTPROCESS_WORK
from harness.analysis.stats import BETWEEN_RUNS
from harness.analysis.verdict import ONE_BLOCK, Change, level_text

MESSAGE_NOTE = (
    f"{ALL_MESSAGES} adds the messages the worker received; {', '.join(NOT_MESSAGES)} runs"
    " inside the postprocess's tail or an abort message, so it is not in that total"
)


def number(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}"


def joined(values: list, show=number) -> str:
    """Per-server values in schedule order: `20463 / 20457`."""
    return " / ".join(show(v) for v in values) or "-"


# Interval bounds past these print as such: a ratio's interval from few replicates (one block:
# 1 degree of freedom, t ~ 400 at a Bonferroni level) runs to exp(+-many), which as a
# percentage is digits that say nothing the "past" form does not.
FAR_LOW, FAR_HIGH = -0.999, 9.99  # -99.9%, +999%


def bound_text(offset: float, digits: int = 1, percent_sign: bool = True) -> str:
    """One bound of a change's interval (ratio - 1) as a signed percentage; past FAR_LOW or
    FAR_HIGH, `<-99.9%` or `>+999%`."""
    sign = "%" if percent_sign else ""
    if offset < FAR_LOW:
        return f"<{FAR_LOW * 100:+.1f}{sign}"
    if offset > FAR_HIGH:
        return f">{FAR_HIGH * 100:+.0f}{sign}"
    return f"{offset * 100:+.{digits}f}{sign}"


def change_text(change: Change) -> str:
    if change.ratio is None:
        return "-"
    if change.low is None:
        return f"{change.ratio - 1:+.1%} (no interval)"
    # compact, for 80 columns: +4.5% (-7.5..+18.0%)
    low = bound_text(change.low - 1, percent_sign=False)
    return f"{change.ratio - 1:+.1%} ({low}..{bound_text(change.high - 1)})"


def verdict_words(c: Comparison) -> str:
    """The headline's verdict as every output says it (terminal, report, pull-request
    comment): `slower -3.0% (-3.8..-2.2%): fails the run (at least --fail-at 1.0%)`."""
    row = c.headline_row
    if row is None:
        return "no headline figure"
    words = verdict_text(row.change)
    if row.change.ratio is not None:
        words += f" {change_text(row.change)}"
    return words + exit_words(c)


def exit_words(c: Comparison) -> str:
    """What the headline's verdict does to the exit code, where it does anything."""
    if c.failed:
        return ": no result, a server failed or an arm has none left"
    if c.withheld:
        return ": withheld, the servers saw different loads from outside the run (interference)"
    if c.regression:
        return f": fails the run (slower by at least --fail-at {c.rule.fail_at:.1%})"
    if c.slower_by is not None:
        return f": under --fail-at {c.rule.fail_at:.1%}, so it passes"
    return ""


def verdict_text(change: Change) -> str:
    weaker = " (1 block)" if change.method == ONE_BLOCK else ""
    return change.verdict + weaker


def caption(c: Comparison) -> str:
    """What the figures table's intervals and verdicts are: which figure decides the exit
    code, how the others are held together, what the replicates are, which window the
    latencies cover."""
    headline = next((f.label for f in c.figures if f.figure == c.headline), c.headline)
    if c.unit == BETWEEN_RUNS:
        units = f"{c.blocks} recorded runs, each run one replicate"
        if any(f.change.low is None for f in c.figures if f.figure == c.headline):
            units += " (one run a side: every change is descriptive, with no verdict)"
    else:
        units = f"{c.blocks} block(s) of fresh servers, every server a replicate"
        if c.blocks < MIN_BLOCKS:
            units += f" (fewer than {MIN_BLOCKS} blocks: intervals, no verdicts)"
    return (
        f"B against A over {units}. {headline} ({level_text(c.rule.level)} CI) alone decides"
        f" the exit code; {POSTPROCESS_WORK} ({level_text(c.rule.level)} CI) is judged on its"
        f" own, as the worker's diagnostic; the other {c.family} figures and phases are held"
        f" together at {level_text(c.rule.level)} (Bonferroni: each interval at"
        f" {c.family_rule.level:.2%}), so an A/A run shows a verdict on any of them at most"
        f" {level_text(1 - c.rule.level)} of the time."
        f" 'faster'/'slower': the interval excludes 0; 'no change': it covers 0 within"
        f" +-{c.rule.margin:.1%}.{_looks(c)} Latency percentiles cover each server's steady"
        " window."
    )


def _looks(c: Comparison) -> str:
    if c.rule.looks <= 1:
        return ""
    return (
        f" --blocks auto: look {c.rule.look} of at most {c.rule.looks}, its intervals at"
        f" {c.rule.level:.2%} (the error rate split over the looks: half to the first, the"
        " rest evenly)."
    )


def phase_caption(c: Comparison) -> str:
    """The levels of the phase table's intervals."""
    return (
        f"{POSTPROCESS_WORK}: {level_text(c.rule.level)} interval; every other phase:"
        f" {c.family_rule.level:.2%} (Bonferroni over the {c.family} figures and phases besides"
        f" the headline and {POSTPROCESS_WORK})"
    )


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def significant(value: float | None) -> str:
    """Three significant digits."""
    return "-" if value is None else f"{value:.3g}"
