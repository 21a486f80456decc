"""`bench scenarios` as a rich table: each scenario's sizes and load."""

from __future__ import annotations

from rich.table import Table


def render(rows: list[dict]) -> Table:
    table = Table("scenario", "size", "device", "prompt", "output", "requests")
    table.add_column("headline", overflow="fold")  # a figure's name: folded, never cut
    for r in rows:
        size = r["size"] + (" (default here)" if r["default"] else "")
        prompt, output = ("{}-{}".format(*r[k]) for k in ("prompt_tokens", "output_tokens"))
        requests = f"{r['requests']} (+{r['warmup']} warmup)"
        table.add_row(r["scenario"], size, r["device"], prompt, output, requests, r["headline"])
    return table
