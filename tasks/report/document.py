"""A small document model, rendered to HTML (Jinja2 templates, autoescaped) or to Markdown.

Both documents are built as a list of blocks (headings, paragraphs, warnings, bullet lists, tables,
figures); the internal report renders them to one self-contained HTML page, the release notes to
Markdown (published) or HTML.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from jinja2 import Environment, PackageLoader, StrictUndefined


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    highlight: set[tuple[int, int]] = field(default_factory=set)  # (row, column) cells to mark
    caption: str = ""
    kind: ClassVar[str] = "table"


@dataclass(frozen=True)
class Heading:
    level: int  # 1: a section (h2 in HTML, "##" in Markdown), 2: a subsection
    text: str
    kind: ClassVar[str] = "heading"


@dataclass(frozen=True)
class Paragraph:
    text: str
    kind: ClassVar[str] = "paragraph"


@dataclass(frozen=True)
class WarningLine:
    text: str
    kind: ClassVar[str] = "warning"


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]
    kind: ClassVar[str] = "bullets"


@dataclass(frozen=True)
class Image:
    png: bytes
    caption: str
    kind: ClassVar[str] = "image"

    @property
    def base64(self) -> str:
        return base64.b64encode(self.png).decode("ascii")


Block = Heading | Paragraph | WarningLine | Bullets | Table | Image


@dataclass
class Document:
    blocks: list[Block] = field(default_factory=list)

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(Heading(level, text))

    def paragraph(self, text: str) -> None:
        self.blocks.append(Paragraph(text))

    def warning(self, text: str) -> None:
        self.blocks.append(WarningLine(text))

    def bullets(self, items: Iterable[str]) -> None:
        self.blocks.append(Bullets(tuple(items)))

    def table(self, table: Table) -> None:
        self.blocks.append(table)

    def image(self, png: bytes, caption: str) -> None:
        self.blocks.append(Image(png, caption))

    def to_html(self, title: str, banner: str | None = None) -> str:
        """One self-contained HTML page (styles inline, figures as data URIs); `banner` above and below."""
        return _environment().get_template("document.html.j2").render(title=title, banner=banner, blocks=self.blocks)

    def to_markdown(self, title: str) -> str:
        out = [f"# {title}", ""]
        for block in self.blocks:
            if isinstance(block, Heading):
                out += ["#" * (block.level + 1) + " " + block.text, ""]
            elif isinstance(block, Paragraph):
                out += [block.text, ""]
            elif isinstance(block, WarningLine):
                out += [f"**{block.text}**", ""]
            elif isinstance(block, Bullets):
                out += [f"- {item}" for item in block.items] + [""]
            elif isinstance(block, Table):
                out += [_table_markdown(block), ""]
            elif isinstance(block, Image):  # the published notes carry no figures; keep the caption only
                out += [f"*{block.caption}*", ""]
        return "\n".join(out)


_ENVIRONMENT: Environment | None = None


def _environment() -> Environment:
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        _ENVIRONMENT = Environment(
            loader=PackageLoader("dpsynth.tasks.report", "templates"),
            autoescape=True,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            undefined=StrictUndefined,
        )
    return _ENVIRONMENT


def _table_markdown(table: Table) -> str:
    def cell(text: object) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = []
    if table.caption:
        lines += [f"*{table.caption}*", ""]
    lines.append("| " + " | ".join(cell(h) for h in table.header) + " |")
    lines.append("|" + "|".join(" --- " for _ in table.header) + "|")
    for row in table.rows:
        lines.append("| " + " | ".join(cell(c) for c in row) + " |")
    return "\n".join(lines)
