"""The A/B comparison of one run: figures with paired changes, servers, phases, message costs
and the doubts that qualify them, made into one `Comparison` (comparison.py's record).

Pure: frames in, dataclasses out. The terminal (harness/show/comparison.py) and the report
(harness/show/report/) lay it out and compute nothing of their own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import pandas as pd

from harness.analysis import phases, server_figures
from harness.analysis.comparison import (
    Comparison,
    FigureRow,
    MessageRow,
    PhaseRow,
    ServerRow,
)
from harness.analysis.doubts import comparison_doubts
from harness.analysis.interference import interference_doubt
from harness.analysis.schema import LETTERS, SERVER_KEY, empty
from harness.analysis.stats import BETWEEN_RUNS, IN_BLOCKS, paired_change, run_change, valid
from harness.analysis.verdict import Rule

HEADLINE = "output_tok_per_s"
# The statistics a Comparison was made with: 2 since issue 11 (the block + arm model, the
# equivalence margin, the headline alone deciding); 3 since one block gives no verdict
# (block_model.MIN_BLOCKS); 4 since significance comes first (an interval that excludes 0 is a
# verdict however small; the exit code trips at Rule.fail_at), and a server whose headline is
# not finite and positive is a failed server. A summary.json without the field is 1.
STATISTICS = 4


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
    allow_interference: bool = False,
) -> Comparison:
    """Compare arm B against arm A, the rows told apart by their letter (so an A/A run of one
    arm works). `labels` maps "A"/"B" to the manifest's arm labels; `external` names the
    letters whose arm is an external URL (no spans expected); `audio` says the load was
    speech, whose figures are audio-seconds/s, TTFA, E2E and RTF (server_figures.figures). With
    `unit=BETWEEN_RUNS` the rows' `block` names a recorded run, and each run is one replicate
    (stats.run_change).

    The headline is judged at `rule`; it alone decides `regression`. The postprocess's own
    work, the worker's designated diagnostic, is judged at `rule` too, on its own. Every other
    figure and phase is judged at `rule.family(m)`, m being their number, so that an A/A run
    shows a verdict on any of them at most 1 - level of the time (docs/STATISTICS.md)."""
    if spans is None or spans.empty:
        spans = empty("spans")
    servers_frame = servers
    every_server = server_figures.server_summary(requests, servers, audio)
    failed = _failed(every_server, headline)
    if failed:  # their other figures would describe the fault, not the arm
        requests, spans = (_without(frame, failed) for frame in (requests, spans))
        servers = _without(servers, failed)
    per_server = server_figures.server_summary(requests, servers, audio)
    per_arm = server_figures.arm_summary(requests, servers, audio).set_index("letter")
    shown = _blanked(every_server, failed)  # every server in schedule order, failed ones None
    phase_values = phases.phase_table(spans, phases.BY_SERVER, waits)
    listed = server_figures.figures(audio)
    designated = {headline, phases.POSTPROCESS_WORK}
    family = len({f.name for f in listed} - designated)
    family += len(set(phase_values["name"]) - designated)
    judge = _judge(unit)

    def rule_for(name: str) -> Rule:
        return rule if name in designated else rule.family(family)

    figures = [
        _figure_row(
            fig, per_server, shown, per_arm, judge, rule_for(fig.name), fig.name == headline
        )
        for fig in listed
    ]
    result = Comparison(
        labels={letter: labels.get(letter, letter) for letter in LETTERS},
        headline=headline,
        blocks=next((f.change.blocks for f in figures if f.figure == headline), 0),
        rule=rule,
        figures=figures,
        servers=_server_rows(every_server, servers_frame),
        phases=_phase_rows(spans, phase_values, waits, judge, rule_for),
        postprocess_waits=list(waits),
        messages=_message_rows(spans),
        family=family,
        unit=unit,
        statistics=STATISTICS,
        failed_servers=[name for name, _ in failed],
    )
    result.doubts = comparison_doubts(result, requests, per_server, servers_frame, spans, external)
    said = _errored(servers_frame)  # already doubted with their error (doubts.py)
    result.doubts += _failed_doubts([f for f in failed if f[1] not in said], headline, listed)
    if unit == IN_BLOCKS:  # between recorded runs the run is the unit, its day's load its own
        result.interference = interference_doubt(servers[servers["letter"].isin(LETTERS)])
    result.interference_allowed = allow_interference
    if result.interference is not None:
        allowed = " (allowed by --allow-interference: the verdict stands)"
        result.doubts.append(result.interference + (allowed if allow_interference else ""))
    return result


def _errored(servers: pd.DataFrame) -> set[tuple]:
    """The servers whose record holds an error (a failed slot, named by the run)."""
    if servers.empty or "error" not in servers.columns:
        return set()
    errors = servers["error"]
    has = errors.notna() & (errors.astype(str) != "")
    return set(servers.loc[has, SERVER_KEY].itertuples(index=False, name=None))


def _failed(per_server: pd.DataFrame, headline: str) -> list[tuple[str, tuple]]:
    """The A/B servers whose headline is not a finite positive value (0 tok/s, a negative or
    NaN or inf figure): (name, server key) in schedule order."""
    if per_server.empty or headline not in per_server.columns:
        return []
    rows = per_server[per_server["letter"].isin(LETTERS)]
    bad = rows[~valid(rows[headline])]
    return [(_name(key), key) for key in bad[SERVER_KEY].itertuples(index=False, name=None)]


def _without(frame: pd.DataFrame, failed: list[tuple[str, tuple]]) -> pd.DataFrame:
    if frame.empty or not set(SERVER_KEY) <= set(frame.columns):
        return frame
    keys = pd.MultiIndex.from_frame(frame[SERVER_KEY])
    return frame[~keys.isin([key for _, key in failed])]


def _name(key: tuple) -> str:
    letter, block, slot = key
    return f"{letter}{slot}"


def _failed_doubts(failed, headline: str, listed) -> list[str]:
    """One doubt naming the servers whose headline failed."""
    if not failed:
        return []
    label = next((f.label for f in listed if f.name == headline), headline)
    names = ", ".join(name for name, _ in failed)
    return [
        f"servers {names}: {label} is not a finite positive value (0 tokens measured, or a"
        " broken record): counted as failed and left out of every figure; see their logs"
        " and errors"
    ]


def _values(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    return frame[["letter", "block", "slot", column]].rename(columns={column: "value"})


def _judge(unit: str):
    if unit not in (IN_BLOCKS, BETWEEN_RUNS):
        raise ValueError(f"unit is {IN_BLOCKS!r} or {BETWEEN_RUNS!r}, not {unit!r}")
    return paired_change if unit == IN_BLOCKS else run_change


def _figure_row(
    fig: server_figures.Figure, per_server, shown, per_arm, judge, rule: Rule, plan: bool
) -> FigureRow:
    values = _values(per_server, fig.name)
    listed = _values(shown, fig.name)
    return FigureRow(
        fig.name,
        fig.label,
        fig.unit,
        fig.higher_is_better,
        a=per_arm[fig.name].get("A"),
        b=per_arm[fig.name].get("B"),
        change=judge(values, "A", "B", fig.higher_is_better, rule, plan),
        servers_a=listed.loc[listed["letter"] == "A", "value"].tolist(),
        servers_b=listed.loc[listed["letter"] == "B", "value"].tolist(),
    )


def _blanked(per_server: pd.DataFrame, failed: list[tuple[str, tuple]]) -> pd.DataFrame:
    """The per-server table with the failed servers' figures blanked (NaN: None in JSON)."""
    if not failed or per_server.empty:
        return per_server
    keys = pd.MultiIndex.from_frame(per_server[SERVER_KEY])
    gone = keys.isin([key for _, key in failed])
    figures = [c for c in per_server.columns if c not in (*SERVER_KEY, "healthy")]
    out = per_server.astype({c: float for c in figures if per_server[c].dtype != object})
    out.loc[gone, figures] = float("nan")
    return out


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
