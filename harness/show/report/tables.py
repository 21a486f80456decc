"""The report's tables, each laid out from the `Comparison` (or the manifest, for the arms):
figures, throughput per server, worker phases, message costs."""

from __future__ import annotations

from engine import spans as names
from harness.analysis import phases
from harness.analysis.comparison import Comparison, FigureRow, PhaseRow
from harness.analysis.schema import LETTERS
from harness.show.format import change_text, joined, number, verdict_text
from harness.show.report.blocks import Table
from harness.show.report.evidence import Evidence


def _change_columns(f: FigureRow | PhaseRow) -> list[str]:
    return [change_text(f.change), verdict_text(f.change)]


def figure_table(c: Comparison, a: str, b: str) -> Table:
    ci = "change (CI)"
    rows = []
    for f in c.figures:
        name = f.label if f.unit in f.label else f"{f.label} ({f.unit})"
        if f.figure == c.headline:
            name = f"**{name}**"
        rows.append([name, number(f.a), number(f.b), *_change_columns(f)])
    return Table(["figure", a, b, ci, "verdict"], rows, "lrrrl")


def server_table(c: Comparison, a: str, b: str) -> Table:
    def where(x: str) -> str:
        return joined([s for s in c.servers if s.letter == x], lambda s: f"b{s.block} s{s.slot}")

    rows = [["server", where("A"), where("B")]]
    rows += [
        [f.label, joined(f.servers_a), joined(f.servers_b)] for f in c.figures if f.higher_is_better
    ]
    failed = ([s.failed for s in c.servers if s.letter == x] for x in LETTERS)
    rows.append(["failed requests", *(joined(f, str) for f in failed)])
    return Table(["figure", a, b], rows)


def _phase_order(name: str) -> tuple[int, str]:
    prefixes = (phases.POSTPROCESS_WORK, phases.POSTPROCESS, names.POSTPROCESS, names.STEP)
    rank = next((i for i, p in enumerate(prefixes) if name.startswith(p)), len(prefixes))
    return rank, name


def phase_table(c: Comparison, a: str, b: str) -> Table:
    ci = "change (CI)"
    rows = []
    for p in sorted(c.phases, key=lambda p: _phase_order(p.name)):
        if not p.name.startswith(phases.MESSAGE):
            name = p.name if p.name == phases.POSTPROCESS_WORK else f"`{p.name}`"
            rows.append([name, number(p.a_ms), number(p.b_ms), *_change_columns(p)])
    return Table(["phase", a, b, ci, "verdict"], rows, "lrrrl")


def message_table(c: Comparison, a: str, b: str) -> Table:
    rows = []
    for m in c.messages:
        name = f"↳ {m.name.removeprefix(m.parent + '.')}" if m.parent else f"`{m.name}`"
        rows.append([name, number(m.a_ms), number(m.b_ms)])
    return Table(["stage", a, b], rows)


def arms_table(evidence: Evidence) -> Table:
    rows = []
    for arm in evidence.manifest.get("arms") or []:
        commit = (arm.get("commit") or "-")[:12]
        dirty = f"yes (diff {arm['diff_hash']})" if arm.get("dirty") else "no"
        overrides = ", ".join(f"`{k}={v}`" for k, v in (arm.get("overrides") or {}).items())
        kind = f"url {arm['url']}" if arm.get("url") else arm.get("kind", "?")
        cells = [arm.get("letter", "?"), arm.get("name", "?"), kind, f"`{commit}`", dirty]
        rows.append([*cells, overrides or "-"])
    return Table(["arm", "label", "kind", "commit", "dirty", "overrides"], rows, "llllll")
