"""The A/B comparison of one run: figures with paired changes, servers, phases, message costs
and the doubts that qualify them, as one JSON-ready `Comparison` (summary.json holds it).

Pure: frames in, dataclasses out. The terminal (harness/show/comparison.py) and the report
(harness/show/report/) lay it out and compute nothing of their own.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field

import msgspec
import pandas as pd

from harness.analysis import metrics, phases
from harness.analysis.doubts import comparison_doubts
from harness.analysis.schema import LETTERS, SCHEMA_VERSION, empty
from harness.analysis.stats import (
    BETWEEN_RUNS,
    IN_BLOCKS,
    SLOWER,
    Change,
    Rule,
    paired_change,
    run_change,
)

HEADLINE = "output_tok_per_s"
# The statistics a Comparison was made with: 2 since issue 11 (the block + arm model, the
# equivalence margin, the headline alone deciding); 3 since one block gives no verdict
# (stats.MIN_BLOCKS). A summary.json without the field is 1.
STATISTICS = 3


@dataclass
class FigureRow:
    figure: str
    label: str
    unit: str
    higher_is_better: bool
    a: float | None  # the arm's pooled value (metrics.arm_summary)
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

    @property
    def family_rule(self) -> Rule:
        return self.rule.family(self.family)

    @property
    def regression(self) -> bool:
        """B's headline figure is worse than A's, with confidence."""
        return any(f.figure == self.headline and f.change.verdict == SLOWER for f in self.figures)

    def to_json(self) -> dict:
        """Plain types only; NaN becomes None (summary.json is strict JSON)."""
        return _plain(asdict(self) | {"regression": self.regression})

    @classmethod
    def from_json(cls, data: Mapping) -> Comparison:
        """The comparison `to_json` wrote (keys it does not know are left out)."""
        return msgspec.convert(data, cls)


def compare(
    requests: pd.DataFrame,
    spans: pd.DataFrame | None,
    servers: pd.DataFrame,
    labels: Mapping[str, str],
    *,
    external: Collection[str] = (),
    audio: bool = False,
    headline: str = HEADLINE,
    rule: Rule = Rule(),
    waits: tuple[str, ...] = phases.POSTPROCESS_WAITS,
    unit: str = IN_BLOCKS,
) -> Comparison:
    """Compare arm B against arm A, the rows told apart by their letter (so an A/A run of one
    arm works). `labels` maps "A"/"B" to the manifest's arm labels; `external` names the
    letters whose arm is an external URL (no spans expected); `audio` says the load was
    speech, whose figures are audio-seconds/s, TTFA, E2E and RTF (metrics.figures). With
    `unit=BETWEEN_RUNS` the rows' `block` names a recorded run, and each run is one replicate
    (stats.run_change).

    The headline is judged at `rule`; it alone decides `regression`. The postprocess's own
    work, the worker's designated diagnostic, is judged at `rule` too, on its own. Every other
    figure and phase is judged at `rule.family(m)`, m being their number, so that an A/A run
    shows a verdict on any of them at most 1 - level of the time (docs/STATISTICS.md)."""
    if spans is None or spans.empty:
        spans = empty("spans")
    per_server = metrics.server_summary(requests, servers, audio)
    per_arm = metrics.arm_summary(requests, servers, audio).set_index("letter")
    phase_values = phases.phase_table(spans, phases.BY_SERVER, waits)
    listed = metrics.figures(audio)
    designated = {headline, phases.POSTPROCESS_WORK}
    family = len({f.name for f in listed} - designated)
    family += len(set(phase_values["name"]) - designated)
    judge = _judge(unit)

    def rule_for(name: str) -> Rule:
        return rule if name in designated else rule.family(family)

    figures = [
        _figure_row(fig, per_server, per_arm, judge, rule_for(fig.name), fig.name == headline)
        for fig in listed
    ]
    result = Comparison(
        labels={letter: labels.get(letter, letter) for letter in LETTERS},
        headline=headline,
        blocks=next((f.change.blocks for f in figures if f.figure == headline), 0),
        rule=rule,
        figures=figures,
        servers=_server_rows(per_server, servers),
        phases=_phase_rows(spans, phase_values, waits, judge, rule_for),
        postprocess_waits=list(waits),
        messages=_message_rows(spans),
        family=family,
        unit=unit,
        statistics=STATISTICS,
    )
    result.doubts = comparison_doubts(result, requests, per_server, servers, spans, external)
    return result


def _values(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    return frame[["letter", "block", "slot", column]].rename(columns={column: "value"})


def _judge(unit: str):
    if unit not in (IN_BLOCKS, BETWEEN_RUNS):
        raise ValueError(f"unit is {IN_BLOCKS!r} or {BETWEEN_RUNS!r}, not {unit!r}")
    return paired_change if unit == IN_BLOCKS else run_change


def _figure_row(
    fig: metrics.Figure, per_server, per_arm, judge, rule: Rule, plan: bool
) -> FigureRow:
    values = _values(per_server, fig.name)
    return FigureRow(
        fig.name,
        fig.label,
        fig.unit,
        fig.higher_is_better,
        a=per_arm[fig.name].get("A"),
        b=per_arm[fig.name].get("B"),
        change=judge(values, "A", "B", fig.higher_is_better, rule, plan),
        servers_a=values.loc[values["letter"] == "A", "value"].tolist(),
        servers_b=values.loc[values["letter"] == "B", "value"].tolist(),
    )


def _phase_rows(spans, per_server: pd.DataFrame, waits, judge, rule_for) -> list[PhaseRow]:
    pooled = phases.phase_table(spans, phases.BY_ARM, waits).set_index(["name", "letter"])
    rows = []
    for name, values in per_server.groupby("name", sort=True):
        values = values.rename(columns={"ms_per_iter": "value"})
        # blocks needed: for the headline and the postprocess's own work only (doubts.py)
        plan = name == phases.POSTPROCESS_WORK
        change = judge(values, "A", "B", False, rule_for(name), plan)
        a, b = (pooled["ms_per_iter"].get((name, letter)) for letter in LETTERS)
        rows.append(PhaseRow(name, a, b, change))
    return rows


def _message_rows(spans: pd.DataFrame) -> list[MessageRow]:
    pooled = phases.message_costs(spans, phases.BY_ARM).set_index(["name", "letter"])
    costs = pooled["ms_per_request"]
    names = sorted(set(pooled.index.get_level_values("name")))
    return [
        MessageRow(n, phases.message_parent(n), costs.get((n, "A")), costs.get((n, "B")))
        for n in names
    ]


def _server_rows(per_server: pd.DataFrame, servers: pd.DataFrame) -> list[ServerRow]:
    facts = servers.set_index(["block", "slot"])
    return [
        ServerRow(
            int(r.block),
            int(r.slot),
            r.letter,
            facts.at[(r.block, r.slot), "arm"],
            r.healthy,
            int(r.requests),
            int(r.failed),
            r.output_tok_per_s,
            facts.at[(r.block, r.slot), "error"],
        )
        for r in per_server.itertuples(index=False)
    ]


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
