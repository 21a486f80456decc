"""The engine's settings registry as rows, a rich table (`bench config`) and the markdown of
docs/CONFIG.md (tests/test_config_registry.py holds the file to it)."""

from __future__ import annotations

from rich.table import Table

from engine.config import SETTINGS


def setting_rows() -> list[dict]:
    """One row a setting, in the registry's order (by owner)."""
    return [
        {
            "name": f"engine.{s.name}",
            "owner": s.owner,
            "file": f"engine/config/{s.owner}.py",
            "default": s.default,
            "meaning": s.meaning,
        }
        for s in SETTINGS
    ]


def render(rows: list[dict]) -> Table:
    table = Table("setting", "owner", "default")
    table.add_column("meaning", overflow="fold")
    for r in rows:
        table.add_row(r["name"], r["owner"], repr(r["default"]), r["meaning"])
    return table


def markdown(rows: list[dict]) -> str:
    """docs/CONFIG.md: the settings by owner, each with its default and meaning."""
    lines = [
        "# Engine settings",
        "",
        "Generated from the engine's registry (engine/config/whole.py) by",
        "`python -m harness.show.config > docs/CONFIG.md`; `bench config` lists the same.",
        "A setting is named flat in a scenario (`engine:`) and in `--set engine.NAME=value`;",
        "its owner's file under engine/config/ declares it, checks it and says why it exists.",
    ]
    owner = None
    for r in rows:
        if r["owner"] != owner:
            owner = r["owner"]
            lines += ["", f"## {owner} ({r['file']})", "", "| setting | default | meaning |"]
            lines.append("|---|---|---|")
        lines.append(f"| `{r['name']}` | `{r['default']!r}` | {r['meaning']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(setting_rows()), end="")
