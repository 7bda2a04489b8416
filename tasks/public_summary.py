"""SUMMARY.html: a one-page public picture of a released table, from its synthetic rows only.

One image per column (a bar chart of a binary or categorical column's levels, labelled with their
meanings; a histogram of a continuous column over its public bounds) and a heatmap of the Spearman
correlations between all columns, with the release's epsilon, its statement of what epsilon covers and
how the target was set. The page is self-contained (images inlined as base64 PNG) and is made from
the synthetic frame, the public schema and the `PublicRelease` handed to it: it reads no file.
Figures are `matplotlib.figure.Figure` objects (Agg canvas), never pyplot's global state, as in the
internal report (tasks/report/figures.py).

The images are small palette PNGs: the page stays light, and the base64 text (in which any digits may
appear by chance) stays short.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from PIL import Image

from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.tasks.data_dictionary import epsilon_text, target_paragraph, values_text
from dpsynth.tasks.public_release import PublicRelease

HISTOGRAM_BINS = 30
DPI = 72
CHART_COLOURS = 16  # palette sizes: a chart has a handful of colours, the heatmap its colour steps
HEATMAP_COLOURS = 64
CORRELATION_STEPS = 20  # the heatmap's colour scale, in steps of 0.1
COLOUR = "#3b6ea5"


def _png(figure: Figure, colours: int = CHART_COLOURS) -> str:
    """The figure as a base64 palette PNG of `colours` colours."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=colours)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return base64.b64encode(out.getvalue()).decode("ascii")


def level_label(column: Column, level: object) -> str:
    """A level as a chart shows it: its meaning when the schema gives one, else the code itself."""
    return column.meaning(level) or str(level)


def column_figure(column: Column, values: pd.Series) -> Figure:
    """The column's marginal: shares of its levels, or a histogram over its public bounds."""
    figure = Figure(figsize=(3.6, 2.4))
    axes = figure.add_subplot()
    if column.is_continuous:
        low, high = column.continuous_bounds
        numbers = pd.to_numeric(values, errors="coerce").dropna().to_numpy(dtype=float)
        axes.hist(numbers, bins=np.linspace(low, high, HISTOGRAM_BINS + 1).tolist(), color=COLOUR)
        axes.set_xlim(low, high)
        axes.set_xlabel(column.unit or column.name, fontsize=8)
        axes.set_ylabel("rows", fontsize=8)
    else:
        counts = values.value_counts()
        shares = [float(counts.get(level, 0)) / max(len(values), 1) for level in column.levels]
        labels = [level_label(column, level) for level in column.levels]
        axes.bar(range(len(labels)), shares, color=COLOUR)
        axes.set_xticks(range(len(labels)), labels, rotation=45 if len(labels) > 3 else 0, ha="right", fontsize=7)
        if len(labels) <= 3:
            for tick in axes.get_xticklabels():
                tick.set_horizontalalignment("center")
        axes.set_ylabel("share of rows", fontsize=8)
        axes.set_ylim(0, min(1.0, 1.15 * max(shares, default=0.0)) or 1.0)
    axes.set_title(column.title, fontsize=9)
    axes.tick_params(labelsize=7)
    # Fixed margins rather than tight_layout, which measures every label and doubles the page's time.
    rotated = not column.is_continuous and len(column.levels) > 3
    figure.subplots_adjust(left=0.17, right=0.97, top=0.9, bottom=0.42 if rotated else 0.2)
    return figure


def rank_codes(frame: pd.DataFrame, schema: DatasetSchema) -> pd.DataFrame:
    """The frame as numbers for rank correlation: a discrete column's levels by their declared order."""
    codes = {}
    for column in schema.columns:
        values = frame[column.name]
        if column.is_continuous:
            codes[column.name] = pd.to_numeric(values, errors="coerce")
        else:
            order = {level: i for i, level in enumerate(column.levels)}
            codes[column.name] = values.map(order).astype("float64")
    return pd.DataFrame(codes)


def correlation_figure(frame: pd.DataFrame, schema: DatasetSchema) -> Figure:
    """Spearman correlations between every pair of columns (a constant column's are left blank)."""
    correlations = rank_codes(frame, schema).corr(method="spearman")
    size = max(3.6, 0.35 * len(schema.columns) + 1.6)
    figure = Figure(figsize=(size + 0.8, size))
    axes = figure.add_subplot()
    colours = matplotlib.colormaps["RdBu_r"].resampled(CORRELATION_STEPS)
    image = axes.imshow(correlations.to_numpy(), cmap=colours, vmin=-1, vmax=1)
    names = list(correlations.columns)
    axes.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
    axes.set_yticks(range(len(names)), names, fontsize=7)
    axes.set_title("Spearman rank correlation", fontsize=9)
    figure.colorbar(image, ax=axes, shrink=0.8).ax.tick_params(labelsize=7)
    figure.tight_layout()
    return figure


def summary_html(frame: pd.DataFrame, schema: DatasetSchema, release: PublicRelease) -> str:
    """The page. `frame` is the released synthetic table (the schema's columns); nothing else is read."""
    missing = [name for name in schema.column_names if name not in frame.columns]
    if missing:
        raise ValueError(f"the synthetic table lacks the schema's columns {missing}")
    escape = html.escape
    figures = []
    for column in schema.columns:
        caption = f"{column.title} ({column.name}): {values_text(column)}"
        figures.append(
            f'<figure><img alt="{escape(column.name)}" src="data:image/png;base64,'
            f'{_png(column_figure(column, frame[column.name]))}"><figcaption>{escape(caption)}</figcaption></figure>'
        )
    heatmap_png = _png(correlation_figure(frame, schema), HEATMAP_COLOURS)
    heatmap = (
        f'<figure class="wide"><img alt="correlations" src="data:image/png;base64,{heatmap_png}">'
        "<figcaption>Spearman rank correlation between columns (discrete levels in their declared order)"
        "</figcaption></figure>"
    )
    target = target_paragraph(schema, release).replace("**", "").replace("`", "")
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{escape(schema.name)} synthetic release {escape(release.release_id)}</title>",
            "<style>body{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em}"
            "figure{display:inline-block;margin:.4em;vertical-align:top;width:270px}"
            "figure.wide{width:auto}figcaption{font-size:.8em}"
            ".note{border-left:4px solid #c60;padding:.2em .8em;background:#fff6ee}</style>",
            "</head><body>",
            f"<h1>{escape(schema.name)}: synthetic release {escape(release.release_id)}</h1>",
            f"<p>{release.rows:,} synthetic rows from the {escape(release.generator_name)} generator, "
            f"{escape(epsilon_text(release))}. Every chart below is drawn from these synthetic rows only; "
            "no row is a real record.</p>",
            f'<p class="note">{escape(target)}</p>',
            f"<p>{escape(release.statement.covers)}</p>",
            "<h2>Columns</h2>",
            *figures,
            "<h2>Correlations</h2>",
            heatmap,
            "</body></html>",
            "",
        ]
    )


def write_public_summary(path: Path, frame: pd.DataFrame, schema: DatasetSchema, release: PublicRelease) -> Path:
    path = Path(path)
    path.write_text(summary_html(frame, schema, release))
    return path
