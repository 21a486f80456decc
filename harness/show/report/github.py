"""The pull-request comment (`bench report RUN --github`): the report cut to what a reviewer
reads first. The headline verdict, the setup, the figures with their verdicts, the worker
phases, the plots linked where the run's artifact is, the doubts; then the hidden marker by
which scripts/pr_comment.py finds the comment to update rather than add another.

Every word and number is the report's own (document.py, tables.py: the Comparison's fields,
formatted as the terminal formats them); nothing here judges anything.
"""

from __future__ import annotations

from pathlib import Path

from harness.analysis.schema import LETTERS
from harness.show.format import caption, phase_caption
from harness.show.report.blocks import Block, Bullets, Text
from harness.show.report.document import headline, setup
from harness.show.report.evidence import Evidence
from harness.show.report.markdown import to_markdown
from harness.show.report.tables import figure_table, phase_table

MARKER = "<!-- bench-pr-report -->"  # one comment per pull request carries it
DOUBTS_SHOWN = 5  # the rest are in report.md


def comment(evidence: Evidence, plots: list[str], artifact_url: str | None = None) -> str:
    """The comment's markdown. `plots`: the names of the plots drawn (plots/<name>.png);
    `artifact_url`: where the run directory was uploaded (report.md and plots/ in it)."""
    c = evidence.comparison
    a, b = (f"{x}: {c.labels[x]}" for x in LETTERS)
    blocks: list[Block] = [
        Text(headline(c)),
        Text("Setup: " + setup(evidence)),
        figure_table(c, a, b),
        Text(f"*{caption(c)}*"),
    ]
    if c.phases:
        blocks += [
            Text("**Worker phases** (ms per iteration, each arm's servers pooled)"),
            phase_table(c, a, b),
            Text(f"*{phase_caption(c)}.*"),
        ]
    blocks.append(Text(_where(plots, artifact_url)))
    doubts = evidence.doubts
    if doubts:
        more = len(doubts) - DOUBTS_SHOWN
        shown = doubts[:DOUBTS_SHOWN] + ([f"and {more} more in report.md"] if more > 0 else [])
        blocks += [Text("**Doubts**"), Bullets(shown)]
    return to_markdown(blocks) + MARKER + "\n"


def _where(plots: list[str], artifact_url: str | None) -> str:
    files = ", ".join(f"`plots/{name}.png`" for name in plots)
    what = f"report.md and the plots ({files})" if plots else "report.md"
    if artifact_url is None:
        return f"The full report: {what} in the run directory."
    return f"The full report: {what} in [the run's artifact]({artifact_url})."


def write_comment(evidence: Evidence, out: Path, artifact_url: str | None = None) -> Path:
    """comment.md in `out`, beside the report whose plots it names (out/plots/*.png)."""
    plots = sorted(p.stem for p in (Path(out) / "plots").glob("*.png"))
    path = Path(out) / "comment.md"
    path.write_text(comment(evidence, plots, artifact_url))
    return path
