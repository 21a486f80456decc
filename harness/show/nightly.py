"""`bench nightly`'s result: what was measured, and the steps the step test found (new ones,
which fail the night, and known ones, reported on an earlier night), as a rich table."""

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
    if result.cluster:
        lines += _cluster_lines(result.cluster)
    if result.html:
        lines.append(f"HTML: {result.html}")
    if not result.regressions:
        return Group(*lines, "[green]no regression[/]")
    table = Table(title="steps up (per-server step test; every figure is a cost)")
    for column in ("benchmark", "step", "within", "before", "after", "change", ""):
        table.add_column(column)
    for r in result.regressions:
        step = f"{r.before[:8]}..{r.after[:8]}"
        within = f"{r.since[:8]}..{r.until[:8]}"
        status = "known" if r.known else "[red]new[/]"
        change = f"{r.ratio - 1:+.1%}"
        table.add_row(r.benchmark, step, within, f"{r.old:.4g}", f"{r.new:.4g}", change, status)
    count = len(result.new_regressions)
    summary = f"[red]{count} new regression(s)[/]" if count else "[green]no new regression[/]"
    if count < len(result.regressions):
        summary += " (known: reported on an earlier night, not failing this one)"
    return Group(*lines, table, summary)


def _cluster_lines(cluster: dict) -> list[str]:
    """Where each commit ran (hosts and how many commits each), and every lost commit."""
    hosts: dict[str, int] = {}
    for node in cluster["commits"].values():
        hosts[node["host"]] = hosts.get(node["host"], 0) + 1
    where = ", ".join(f"{host} {count}" for host, count in hosts.items()) or "none"
    lines = [f"cluster {cluster['address']}: commits by host: {where}"]
    for lost in cluster["lost"]:
        lines.append(f"[red]{lost['commit'][:8]} not measured[/]: {lost['error']} ({lost['host']})")
    return lines
