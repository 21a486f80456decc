"""The report's blocks as GitHub-flavoured markdown, ready to paste into a pull request."""

from __future__ import annotations

from harness.show.report.blocks import Block, Bullets, Heading, Image, Table, Text, alignment

UPLOAD_HINT = (
    "<!-- Pasting into a pull request: drag the PNGs from plots/ into the editor; GitHub uploads "
    "each and gives a link to put in place of its plots/... path. -->"
)


def to_markdown(blocks: list[Block]) -> str:
    parts = [_block(b) for b in blocks]
    if any(isinstance(b, Image) for b in blocks):
        parts.insert(1, UPLOAD_HINT)
    return "\n\n".join(parts) + "\n"


def _block(block: Block) -> str:
    match block:
        case Heading(text, level):
            return "#" * level + " " + text
        case Text(text):
            return text
        case Bullets(items):
            return "\n".join(f"- {item}" for item in items)
        case Table():
            return _table(block)
        case Image(path, alt, caption):
            return f"![{alt}]({path})\n\n*{caption}*"
    raise TypeError(f"not a report block: {block!r}")


def _table(table: Table) -> str:
    def row(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rule = ["--:" if a == "r" else "---" for a in alignment(table)]
    return "\n".join([row(table.header), "|" + "|".join(rule) + "|", *map(row, table.rows)])
