"""`bench nightly`'s result: what was measured, and the regressions asv's step detection
found, as a rich table."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from harness.analysis.nightly import NightlyResult


def render(result: NightlyResult) -> Group:
    measured = ", ".join(c[:8] for c in result.measured) or "none (all measured)"
    lines = [f"{result.branch} on machine {result.machine}: measured {measured}"]
    if result.failed:
        failed = ", ".join(c[:8] for c in result.failed)
        lines.append(f"[yellow]asv reported failed benchmarks at {failed}[/] (see its output)")
    if result.html:
        lines.append(f"HTML: {result.html}")
    if not result.regressions:
        return Group(*lines, "[green]no regression[/]")
    table = Table(title="regressions (asv step detection; every figure is a cost)")
    for column in ("benchmark", "commits", "before", "after", "change"):
        table.add_column(column)
    for r in result.regressions:
        commits = f"{r.before[:8]}..{r.after[:8]}"
        table.add_row(r.benchmark, commits, f"{r.old:.4g}", f"{r.new:.4g}", f"{r.ratio - 1:+.1%}")
    return Group(*lines, table)
