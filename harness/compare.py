"""The A/B comparison of one run: figures with paired changes, servers, phases, message costs
and the doubts that qualify them. `compare` computes a JSON-ready `Comparison`; `render`
only lays it out as rich tables.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, fields

import pandas as pd
from rich.console import Group
from rich.markup import escape
from rich.table import Table

from harness import metrics, phases
from harness.records import SCHEMA_VERSION, SpanRecord
from harness.stats import NOT_ENOUGH, SLOWER, WITHIN_BLOCK, Change, Rule, paired_change

LETTERS = ("A", "B")
HEADLINE = "output_tok_per_s"


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
    rule: Rule
    figures: list[FigureRow]
    servers: list[ServerRow]
    phases: list[PhaseRow]
    postprocess_waits: list[str]
    messages: list[MessageRow]
    doubts: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    @property
    def regression(self) -> bool:
        """B's headline figure is worse than A's, with confidence."""
        return any(f.figure == self.headline and f.change.verdict == SLOWER for f in self.figures)

    def to_json(self) -> dict:
        """Plain types only; NaN becomes None (summary.json is strict JSON)."""
        return _plain(asdict(self) | {"regression": self.regression})


def compare(
    requests: pd.DataFrame,
    spans: pd.DataFrame | None,
    servers: pd.DataFrame,
    labels: Mapping[str, str],
    *,
    external: Collection[str] = (),
    tokens_per_audio_s: float | None = None,
    headline: str = HEADLINE,
    rule: Rule = Rule(),
    waits: tuple[str, ...] = phases.POSTPROCESS_WAITS,
) -> Comparison:
    """Compare arm B against arm A. `labels` maps "A"/"B" to the manifest's arm labels;
    `external` names the letters whose arm is an external URL (no spans expected). The frames'
    `arm` column is replaced by the server's letter, so an A/A run of one arm works."""
    spans = _with_columns(spans, SpanRecord)
    requests, spans = _by_letter(requests, servers), _by_letter(spans, servers)
    by_letter = servers.assign(arm=servers["letter"])
    per_server = metrics.server_summary(requests, by_letter, tokens_per_audio_s)
    per_arm = metrics.arm_summary(requests, by_letter, tokens_per_audio_s).set_index("arm")
    figures = [
        _figure_row(fig, per_server, per_arm, rule) for fig in metrics.figures(tokens_per_audio_s)
    ]
    phase_rows = _phase_rows(spans, waits, rule)
    result = Comparison(
        labels={letter: labels.get(letter, letter) for letter in LETTERS},
        headline=headline,
        blocks=next((f.change.blocks for f in figures if f.figure == headline), 0),
        rule=rule,
        figures=figures,
        servers=_server_rows(per_server, servers),
        phases=phase_rows,
        postprocess_waits=list(waits),
        messages=_message_rows(spans),
    )
    result.doubts = _doubts(result, per_server, servers, spans, external)
    return result


def _by_letter(frame: pd.DataFrame, servers: pd.DataFrame) -> pd.DataFrame:
    letters = servers.set_index(["block", "slot"])["letter"]
    keys = pd.MultiIndex.from_arrays([frame["block"], frame["slot"]])
    return frame.assign(arm=letters.reindex(keys).to_numpy())


def _with_columns(frame: pd.DataFrame | None, record: type) -> pd.DataFrame:
    names = [f.name for f in fields(record)]
    if frame is None or not set(names) <= set(frame.columns):
        return pd.DataFrame({name: pd.Series(dtype=object) for name in names})
    return frame


def _values(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    return frame[["arm", "block", "slot", column]].rename(columns={column: "value"})


def _figure_row(fig: metrics.Figure, per_server, per_arm, rule: Rule) -> FigureRow:
    values = _values(per_server, fig.name)
    return FigureRow(
        fig.name,
        fig.label,
        fig.unit,
        fig.higher_is_better,
        a=per_arm[fig.name].get("A"),
        b=per_arm[fig.name].get("B"),
        change=paired_change(values, "A", "B", fig.higher_is_better, rule),
        servers_a=values.loc[values["arm"] == "A", "value"].tolist(),
        servers_b=values.loc[values["arm"] == "B", "value"].tolist(),
    )


def _phase_rows(spans: pd.DataFrame, waits, rule: Rule) -> list[PhaseRow]:
    per_server = phases.phase_table(spans, phases.SERVER, waits)
    pooled = phases.phase_table(spans, phases.ARM, waits).set_index(["name", "arm"])
    rows = []
    for name, values in per_server.groupby("name", sort=True):
        change = paired_change(
            values.rename(columns={"ms_per_iter": "value"}), "A", "B", False, rule
        )
        a, b = (pooled["ms_per_iter"].get((name, letter)) for letter in LETTERS)
        rows.append(PhaseRow(name, a, b, change))
    return rows


def _message_rows(spans: pd.DataFrame) -> list[MessageRow]:
    pooled = phases.message_costs(spans, phases.ARM).set_index(["name", "arm"])
    names = sorted(set(pooled.index.get_level_values("name")))
    return [
        MessageRow(
            n, phases.message_parent(n), *(pooled["ms_per_request"].get((n, x)) for x in LETTERS)
        )
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
        )  # fmt: skip
        for r in per_server.itertuples(index=False)
    ]


def _doubts(result: Comparison, per_server, servers, spans, external) -> list[str]:
    doubts = []
    for letter in LETTERS:
        failed = sum(s.failed for s in result.servers if s.letter == letter)
        if failed:
            doubts.append(f"{failed} failed requests in arm {letter}: see status/error in requests")
    for s in servers.itertuples(index=False):
        where = f"server {s.letter} block {s.block} slot {s.slot}"
        if not s.healthy or s.error:
            doubts.append(f"{where}: {s.error or 'never healthy'}; see {s.log}")
        if pd.isna(s.steady_start_s) or pd.isna(s.steady_end_s):
            doubts.append(f"{where}: no steady window, so no steady tok/s")
    untimed = per_server["output_tokens"] - per_server["timed_tokens"]
    if (untimed > 0).any():
        doubts.append(
            f"{int(untimed.sum())} output tokens have no arrival time (text-only stream?):"
            " steady tok/s and ITL undercount them; compare the whole-run tok/s"
        )
    if result.blocks < 2:
        doubts.append(
            f"{result.blocks} paired block(s): the servers of one block are the replicates"
            " (weaker, blind to drift) or there are none; rerun with 3 or more ABBA blocks"
        )
    changes = [(f.label, f.change) for f in result.figures] + [
        (p.name, p.change) for p in result.phases
    ]
    noisy = [(name, c) for name, c in changes if c.verdict == NOT_ENOUGH and c.blocks]
    if noisy:
        needed = max(c.blocks_needed or 0 for _, c in noisy)
        more = f"about {needed} blocks in all" if needed else "more blocks"
        doubts.append(f"too noisy to decide: {', '.join(n for n, _ in noisy)}; rerun with {more}")
    for letter in LETTERS:
        if not (spans["arm"] == letter).any():
            doubts.append(
                f"no spans from arm {letter} (an external server has none)"
                if letter in external
                else f"no spans from arm {letter}: run its servers with the phase-timing flag"
            )
    work = [p for p in result.phases if p.name == phases.POSTPROCESS_WORK]
    if any(min(p.a_ms or 0, p.b_ms or 0) < 0 for p in work):
        doubts.append("postprocess work < 0: a subtracted wait is not inside postprocess_batch")
    return doubts


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


def render(result: Comparison) -> Group:
    """The tables the CLI prints: figures, per-server values, phases, message costs, doubts."""
    a, b = (f"{x}: {escape(result.labels[x])}" for x in LETTERS)
    ci = f"change ({result.rule.level:.0%} CI)"
    figures = _table(f"B against A, {result.blocks} paired blocks", "figure", a, b, ci, "verdict")
    for f in result.figures:
        figures.add_row(
            f"{f.label} ({f.unit})",
            number(f.a),
            number(f.b),
            change_text(f.change),
            verdict_text(f.change),
        )
    servers = _table("per server, schedule order", "figure", a, b)
    for f in result.figures:
        if f.higher_is_better:
            servers.add_row(f.label, _joined(f.servers_a), _joined(f.servers_b))
    failed = ([s.failed for s in result.servers if s.letter == x] for x in LETTERS)
    servers.add_row("failed requests", *(_joined(f, str) for f in failed))
    parts: list = [figures, servers]
    if result.phases:
        waits = ", ".join(result.postprocess_waits)
        title = (
            f"ms per worker iteration ({phases.POSTPROCESS_WORK}: postprocess_batch less {waits})"
        )
        table = _table(title, "phase", a, b, ci, "verdict")
        for p in result.phases:
            table.add_row(
                p.name,
                number(p.a_ms),
                number(p.b_ms),
                change_text(p.change),
                verdict_text(p.change),
            )
        parts.append(table)
    if result.messages:
        table = _table("ms per request (worker.msg.*)", "stage", a, b)
        for m in result.messages:
            table.add_row(("  " if m.parent else "") + m.name, number(m.a_ms), number(m.b_ms))
        parts.append(table)
    parts += [f"[yellow]doubt:[/] {escape(d)}" for d in result.doubts]
    return Group(*parts)


def _table(title: str, first: str, *columns: str) -> Table:
    table = Table(title=title)
    table.add_column(first)
    for column in columns:
        table.add_column(column, justify="left" if column == "verdict" else "right")
    return table


def number(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}"


def _joined(values: list, show=number) -> str:
    return " / ".join(show(v) for v in values) or "-"


def change_text(change: Change) -> str:
    if change.ratio is None:
        return "-"
    return f"{change.ratio - 1:+.1%} ({change.low - 1:+.1%} .. {change.high - 1:+.1%})"


def verdict_text(change: Change) -> str:
    weaker = " (1 block)" if change.method == WITHIN_BLOCK else ""
    return change.verdict + weaker
