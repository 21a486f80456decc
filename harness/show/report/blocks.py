"""The pieces a report is made of, laid out as markdown (markdown.py) or HTML (html.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Heading:
    text: str
    level: int = 3


@dataclass
class Text:
    text: str  # one paragraph; inline **bold**, *italic* and `code`


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    align: str = ""  # one letter per column, l or r; default: the first left, the rest right


@dataclass
class Image:
    path: str  # relative to the report
    alt: str
    caption: str


Block = Heading | Text | Bullets | Table | Image


def alignment(table: Table) -> str:
    """l or r for each column of the table."""
    return table.align or "l" + "r" * (len(table.header) - 1)
