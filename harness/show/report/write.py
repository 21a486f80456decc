"""Writes a report: report.md, plots/*.png and, on request, report.html."""

from __future__ import annotations

from pathlib import Path

from harness.show.report.document import document
from harness.show.report.evidence import Evidence
from harness.show.report.html import to_html
from harness.show.report.markdown import to_markdown


def write_report(evidence: Evidence, out: Path, html: bool = False) -> Path:
    """Write the report of `evidence` into `out`; the path of report.md."""
    from harness.show.report import plots  # matplotlib: loaded only when a report is written

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    blocks = document(evidence, plots.draw_all(evidence, out / "plots"), relative_to=out)
    path = out / "report.md"
    path.write_text(to_markdown(blocks))
    if html:
        (out / "report.html").write_text(to_html(blocks, out, evidence.title))
    return path
