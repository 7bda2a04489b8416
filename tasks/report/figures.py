"""The internal report's figures (thesis Figures 7.1 to 7.4), drawn with matplotlib as PNG bytes.

Figures are drawn on `matplotlib.figure.Figure` objects (Agg canvas), never through pyplot's global
state, so building reports from several threads or processes is safe. They plot numbers computed
elsewhere (selection results, `dpsynth.models.evaluation.quality`), besides the histograms of raw values.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.quality import significance_stars
from dpsynth.tasks.report.formatting import is_finite, is_untrained, untrained_label

REAL_SETTING = "real"
BASELINE_SETTING = "baseline"


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def _color(i: int) -> str:
    return f"C{i % 10}"


def _non_private(rows: pd.DataFrame) -> bool:
    eps = pd.to_numeric(rows["epsilon"], errors="coerce").to_numpy(dtype=np.float64)
    return not np.isfinite(eps).any()


def _line_value(setting: str, rows: pd.DataFrame, chosen: dict) -> float:
    """AUC drawn as a horizontal line for a non-private setting: its chosen checkpoint, else its best."""
    entry = chosen.get(setting) or {}
    if is_finite(entry.get("test_auc")):
        return float(entry["test_auc"])
    return float(rows["test_auc"].max())


@dataclass(frozen=True)
class DrawnFigure:
    """A figure's PNG and the caption that describes what was actually drawn on it."""

    png: bytes
    caption: str


def _reference_points(thesis_reference: dict | None) -> list[tuple[str, float, float]]:
    """(label, epsilon, AUC) of each reference result with a finite epsilon (the others have no place on
    an epsilon axis)."""
    points = []
    for label, entry in (thesis_reference or {}).items():
        if isinstance(entry, dict) and is_finite(entry.get("auc")) and is_finite(entry.get("epsilon")):
            points.append((str(label), float(entry["epsilon"]), float(entry["auc"])))
    return points


def auc_figure(results: pd.DataFrame, chosen: dict, thesis_reference: dict | None) -> DrawnFigure:
    """Figure 7.1: each private setting's AUC against epsilon (star: its chosen checkpoint; hollow circle:
    its untrained checkpoint), non-private settings and the real-vs-real runs as horizontal lines, the
    published reference points as numbered crosses whose key is in the caption (labels beside the points
    overlap where several sit at one epsilon)."""
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.add_subplot()
    data = results.dropna(subset=["test_auc"])
    settings = [s for s in dict.fromkeys(data["setting"]) if s != REAL_SETTING]
    notes = ["lines: AUC against epsilon per checkpoint of each private setting; star: its chosen checkpoint"]
    non_private, untrained_drawn, epsilons = [], False, []
    for i, setting in enumerate(settings):
        rows = data[data["setting"] == setting]
        if _non_private(rows):
            value = _line_value(setting, rows, chosen)
            label = ("non-private baseline" if setting == BASELINE_SETTING else setting) + f" ({value:.3f})"
            ax.axhline(value, color="dimgray", linestyle=":", linewidth=1.5, label=label)
            non_private.append(str(setting))
            continue
        rows = rows[np.isfinite(rows["epsilon"].astype(float))].sort_values("epsilon")
        epsilons += rows["epsilon"].astype(float).tolist()
        ax.plot(
            rows["epsilon"], rows["test_auc"], marker="o", markersize=3, linewidth=1, color=_color(i), label=setting
        )
        untrained = rows[[is_untrained(it) for it in rows["iteration"]]] if "iteration" in rows else rows.iloc[:0]
        if not untrained.empty:
            eps, auc = float(untrained["epsilon"].iloc[0]), float(untrained["test_auc"].iloc[0])
            ax.scatter([eps], [auc], marker="o", s=70, facecolors="none", edgecolors=_color(i), zorder=5)
            ax.annotate(
                untrained_label(eps),
                (eps, auc),
                fontsize=8,
                color=_color(i),
                xytext=(8, 6),
                textcoords="offset points",
            )
            untrained_drawn = True
        pick = chosen.get(setting) or {}
        if is_finite(pick.get("epsilon")) and is_finite(pick.get("test_auc")):
            ax.scatter(
                [pick["epsilon"]], [pick["test_auc"]], marker="*", s=180, color=_color(i), edgecolors="black", zorder=5
            )
            epsilons.append(float(pick["epsilon"]))
    if untrained_drawn:
        notes.append(
            "hollow circle: the untrained checkpoint (iteration 0, before any training step; its epsilon is only "
            "what was spent before training, and its rows are calibrated to the measured marginals when the profile "
            "measures them, which is how it can score above trained checkpoints)"
        )
    if non_private:
        notes.append(f"dotted: non-private setting(s) {', '.join(non_private)} (no epsilon: drawn across)")
    real = data[data["setting"] == REAL_SETTING]
    if not real.empty:
        mean = float(real["test_auc"].mean())
        ax.axhline(mean, color="black", linestyle="--", linewidth=1.5, label=f"real data (mean {mean:.3f})")
        notes.append(f"dashed: real training rows (mean of {len(real)} real-vs-real runs)")
    points = _reference_points(thesis_reference)
    for k, (_, eps, auc) in enumerate(points, start=1):
        ax.scatter([eps], [auc], marker="x", color="gray", zorder=4)
        ax.annotate(str(k), (eps, auc), fontsize=7, color="dimgray", xytext=(4, 2), textcoords="offset points")
        epsilons.append(eps)
    if points:
        ax.scatter([], [], marker="x", color="gray", label="published results (numbered, see caption)")
        notes.append(
            "gray crosses: published results on this table, "
            + "; ".join(
                f"{k} = {label} (epsilon {eps:g}, AUC {auc:.3f})" for k, (label, eps, auc) in enumerate(points, 1)
            )
        )
    if epsilons and max(epsilons) > 10:  # epsilons from 0 to tens: linear up to 1, logarithmic beyond
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlim(left=0)
        notes.append("epsilon axis linear from 0 to 1, logarithmic beyond")
    ax.set_xlabel("epsilon (delta as configured)")
    ax.set_ylabel("AUC on the real test split")
    ax.set_title("Figure 7.1: AUC against epsilon")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    caption = "AUC on the real test split of logistic regression trained on synthetic rows. " + "; ".join(notes) + "."
    return DrawnFigure(_png(fig), caption)


def histogram_figure(schema: DatasetSchema, real: pd.DataFrame | None, synth: pd.DataFrame, setting: str) -> bytes:
    """Figure 7.2: each continuous feature's histogram over its public bounds, real against synthetic."""
    columns = schema.continuous
    fig = Figure(figsize=(3.0 * max(len(columns), 1), 2.8), layout="constrained")
    for i, col in enumerate(columns):
        ax = fig.add_subplot(1, max(len(columns), 1), i + 1)
        low, high = col.continuous_bounds
        bins = np.linspace(low, high, 41).tolist()
        if real is not None:
            values = pd.to_numeric(real[col.name], errors="coerce").dropna()
            ax.hist(values, bins=bins, density=True, color="gray", alpha=0.5, label="real")
        values = pd.to_numeric(synth[col.name], errors="coerce").dropna()
        ax.hist(values, bins=bins, density=True, histtype="step", linewidth=1.5, color="C0", label=setting)
        ax.set_title(f"{col.name}" + (f" ({col.unit})" if col.unit else ""), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(4))  # wide bounds (age in days) would crowd the labels
        ax.set_yticks([])
        if i == 0:
            ax.legend(fontsize=7)
    fig.suptitle(f"Figure 7.2: continuous features, real vs synthetic ({setting})", fontsize=10)
    return _png(fig)


def heatmap_figure(rho: pd.DataFrame, pval: pd.DataFrame, title: str) -> bytes:
    """Figure 7.3: a Spearman correlation matrix with significance stars."""
    n = len(rho)
    fig = Figure(figsize=(0.55 * n + 2.5, 0.5 * n + 1.5), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(rho.to_numpy(dtype=np.float64), cmap="RdBu_r", vmin=-1, vmax=1)
    ax.set_xticks(range(n), rho.columns, rotation=90, fontsize=7)
    ax.set_yticks(range(n), rho.index, fontsize=7)
    for i in range(n):
        for j in range(n):
            r = rho.iat[i, j]
            text = "" if not np.isfinite(r) else f"{r:.2f}\n{significance_stars(pval.iat[i, j])}"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=6,
                color="white" if np.isfinite(r) and abs(r) > 0.6 else "black",
            )
    fig.colorbar(image, ax=ax, shrink=0.8)
    ax.set_title(title, fontsize=9)
    return _png(fig)


def frequency_figure(schema: DatasetSchema, shares: dict[str, dict[str, dict[str, float]]]) -> bytes:
    """Figure 7.4: grouped bars per discrete column; `shares` maps a series name (real, a setting) to
    its level shares."""
    columns = schema.discrete
    ncols = min(4, max(len(columns), 1))
    nrows = math.ceil(len(columns) / ncols) or 1
    fig = Figure(figsize=(3.3 * ncols, 2.6 * nrows), layout="constrained")
    series = list(shares)
    width = 0.8 / max(len(series), 1)
    for k, col in enumerate(columns):
        ax = fig.add_subplot(nrows, ncols, k + 1)
        levels = [str(level) for level in col.levels]
        x = np.arange(len(levels))
        for i, name in enumerate(series):
            values = [shares[name].get(col.name, {}).get(level, 0.0) for level in levels]
            color = "gray" if name == REAL_SETTING else _color(i)
            ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, color=color, label=name)
        ax.set_xticks(x, levels, fontsize=7)
        ax.set_ylim(0, 1)
        ax.tick_params(labelsize=7)
        ax.set_title(col.name, fontsize=9)
        if k == 0:
            ax.legend(fontsize=6)
    fig.suptitle("Figure 7.4: binary and categorical level shares", fontsize=10)
    return _png(fig)
