"""The report's blocks as one self-contained HTML page: images embedded as data URIs."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from harness.show.report.blocks import Block, Bullets, Heading, Image, Table, Text, alignment

STYLE = """
body { font: 14px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       max-width: 940px; margin: 2em auto; padding: 0 1em; color: #1f2328; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #d0d7de; padding: 4px 10px; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { background: #eff1f3; padding: 1px 4px; border-radius: 4px; font-size: 90%; }
figure { margin: 1em 0; } img { width: 100%; max-width: 900px; }
figcaption { color: #59636e; font-style: italic; }
"""
_INLINE = [
    (re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
    (re.compile(r"\*\*(.+?)\*\*"), r"<strong>\1</strong>"),
    (re.compile(r"\*(.+?)\*"), r"<em>\1</em>"),
]


def to_html(blocks: list[Block], base: Path, title: str) -> str:
    """`base`: the directory the blocks' image paths are relative to."""
    body = "\n".join(_block(b, base) for b in blocks)
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}'
        f"</title><style>{STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def inline(text: str) -> str:
    text = html.escape(text, quote=False)
    for pattern, replacement in _INLINE:
        text = pattern.sub(replacement, text)
    return text


def _block(block: Block, base: Path) -> str:
    match block:
        case Heading(text, level):
            return f"<h{level}>{inline(text)}</h{level}>"
        case Text(text):
            return f"<p>{inline(text)}</p>"
        case Bullets(items):
            return "<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>"
        case Table():
            return _table(block)
        case Image(path, alt, caption):
            data = base64.b64encode((base / path).read_bytes()).decode()
            return (
                f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{inline(caption)}</figcaption></figure>"
            )
    raise TypeError(f"not a report block: {block!r}")


def _table(table: Table) -> str:
    head = "".join(f"<th>{inline(h)}</th>" for h in table.header)
    rows = []
    for cells in table.rows:
        tds = (
            f'<td class="num">{inline(c)}</td>' if a == "r" else f"<td>{inline(c)}</td>"
            for a, c in zip(alignment(table), cells, strict=False)
        )
        rows.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
