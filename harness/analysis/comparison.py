"""The A/B comparison of one run as a record: its figures with their paired changes, its
servers, phases, message costs and doubts (`Comparison`, JSON-ready: summary.json holds it).
compare.py makes it from a run's frames; the terminal and the report lay it out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import msgspec
import pandas as pd

from harness.analysis.schema import LETTERS, SCHEMA_VERSION
from harness.analysis.stats import IN_BLOCKS, valid
from harness.analysis.verdict import SLOWER, Change, Rule, worse_by


@dataclass
class FigureRow:
    figure: str
    label: str
    unit: str
    higher_is_better: bool
    a: float | None  # the arm's pooled value (server_figures.arm_summary)
    b: float | None
    change: Change  # paired over servers (stats.paired_change)
    servers_a: list[float | None]  # per-server values in schedule order
    servers_b: list[float | None]


@dataclass
class ServerRow:
    block: int
    slot: int
    letter: str
    arm: str
    healthy: bool
    requests: int
    failed: int
    output_tok_per_s: float | None
    error: str | None


@dataclass
class PhaseRow:
    name: str
    a_ms: float | None  # ms per worker iteration, the arm's servers pooled
    b_ms: float | None
    change: Change


@dataclass
class MessageRow:
    name: str
    parent: str | None  # the message a stage lap belongs to
    a_ms: float | None  # ms per request, the arm's servers pooled
    b_ms: float | None


@dataclass
class Comparison:
    labels: dict[str, str]  # letter -> the manifest's label of the arm
    headline: str
    blocks: int
    rule: Rule  # the headline's and postprocess work's; the rest: rule.family(family)
    figures: list[FigureRow]
    servers: list[ServerRow]
    phases: list[PhaseRow]
    postprocess_waits: list[str]
    messages: list[MessageRow]
    doubts: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    family: int = 0  # the other figures and phases, judged together (Bonferroni)
    unit: str = IN_BLOCKS  # IN_BLOCKS or BETWEEN_RUNS
    statistics: int = 1  # STATISTICS for every comparison compare() makes
    # Servers (or recorded runs) whose headline is not a finite positive value: failed, and
    # left out of every figure; `failed_servers` says so with its doubt.
    failed_servers: list[str] = field(default_factory=list)
    # What ran beside the servers differed between them beyond interference.Bounds: the
    # verdict is withheld (exit 5), unless the run was told to allow it.
    interference: str | None = None
    interference_allowed: bool = False

    @property
    def family_rule(self) -> Rule:
        return self.rule.family(self.family)

    @property
    def headline_row(self) -> FigureRow | None:
        return next((f for f in self.figures if f.figure == self.headline), None)

    @property
    def slower_by(self) -> float | None:
        """How much slower B's headline is (its point estimate, 0.03: 3%) where its verdict
        is "slower"; None otherwise."""
        row = self.headline_row
        if row is None or row.change.verdict != SLOWER:
            return None
        return worse_by(row.change, row.higher_is_better)

    @property
    def regression(self) -> bool:
        """B's headline figure is slower, with confidence, by at least `rule.fail_at`: the
        exit code's 1. A smaller significant slowdown is a verdict, not a failure; a verdict
        withheld for interference is neither."""
        slower = self.slower_by
        enough = slower is not None and slower >= self.rule.fail_at - 1e-12
        return enough and not self.withheld

    @property
    def withheld(self) -> bool:
        """The verdict is withheld: the servers saw different loads from outside the run."""
        return self.interference is not None and not self.interference_allowed

    @property
    def empty_arms(self) -> list[str]:
        """The letters with no server whose headline can be compared: no result."""
        values = {letter: [] for letter in LETTERS}
        row = self.headline_row
        if row is not None:
            values = {"A": row.servers_a, "B": row.servers_b}
        return [x for x in LETTERS if not any(_is_value(v) for v in values[x])]

    @property
    def failed(self) -> bool:
        """A server failed, or an arm has none left: the run's exit code is never 0."""
        return bool(self.failed_servers or self.empty_arms)

    def to_json(self) -> dict:
        """Plain types only; NaN becomes None (summary.json is strict JSON)."""
        derived = {"regression": self.regression, "empty_arms": self.empty_arms}
        derived |= {"withheld": self.withheld}
        return _plain(asdict(self) | derived | {"slower_by": self.slower_by})

    @classmethod
    def from_json(cls, data: Mapping) -> Comparison:
        """The comparison `to_json` wrote (keys it does not know are left out)."""
        return msgspec.convert(data, cls)


def _is_value(value) -> bool:
    return value is not None and bool(valid(pd.Series([value], dtype=float)).iloc[0])


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):  # numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
