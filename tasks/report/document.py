"""A small document model, rendered to HTML (Jinja2 templates, autoescaped) or to Markdown.

Both documents are built as a list of blocks (headings, paragraphs, warnings, bullet lists, tables,
figures, panels that group blocks in one element); the internal report renders them to one
self-contained HTML page, the release notes to Markdown (published) or HTML.
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
    cell_classes: dict[tuple[int, int], str] = field(default_factory=dict)  # (row, column): a CSS class
    kind: ClassVar[str] = "table"

    def column_groups(self, max_columns: int = 12) -> list[list[int]]:
        """Column positions in groups of at most `max_columns`, each group after the first repeating the
        first column (the rows' labels): a wide table is laid out as several tables one under another, so
        that it wraps within the page instead of running off it."""
        if len(self.header) <= max_columns:
            return [list(range(len(self.header)))]
        rest = range(1, len(self.header))
        step = max_columns - 1
        return [[0, *rest[i : i + step]] for i in range(0, len(rest), step)]

    def cell_class(self, row: int, column: int) -> str:
        """The cell's CSS class: "vanished" when highlighted, else its entry in `cell_classes`, else ""."""
        return "vanished" if (row, column) in self.highlight else self.cell_classes.get((row, column), "")


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


@dataclass(frozen=True)
class Panel:
    """Blocks shown together in one element of the page (the internal report's first-screen summary),
    `element_id` naming it so that a check can find it; Markdown lays the blocks out in order."""

    element_id: str
    blocks: tuple[Heading | Paragraph | WarningLine | Bullets | Table, ...]
    kind: ClassVar[str] = "panel"


Block = Heading | Paragraph | WarningLine | Bullets | Table | Image | Panel


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

    def panel(self, panel: Panel) -> None:
        self.blocks.append(panel)

    def to_html(self, title: str, banner: str | None = None) -> str:
        """One self-contained HTML page (styles inline, figures as data URIs); `banner` above and below."""
        return _environment().get_template("document.html.j2").render(title=title, banner=banner, blocks=self.blocks)

    def to_markdown(self, title: str) -> str:
        out = [f"# {title}", ""]
        for block in _flat(self.blocks):
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


def _flat(blocks: Iterable[Block]) -> list[Block]:
    """The blocks with each panel's own in its place."""
    out: list[Block] = []
    for block in blocks:
        out += list(block.blocks) if isinstance(block, Panel) else [block]
    return out


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
