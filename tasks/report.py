"""Stage 9: the two documents of a run, one per audience (docs/privacy.md section 7).

- `build_internal_report`: ONE self-contained HTML file for the data steward (figures embedded as
  base64 PNG). It holds real-data statistics (AUCs on the real test split, real distributions,
  correlations, importances, imputation counts), so it is marked INTERNAL and never published.
- `build_release_notes` / `build_release_notes_html`: the published notes. They hold ONLY content
  covered by the DP guarantee or public by construction: statistics of the released synthetic table,
  the privacy parameters, the settings, the epsilon ledger, the public schema, and the statement of
  what epsilon covers. No AUC (even the released checkpoint's AUC is measured on real test rows), no
  real-data statistic, no imputation count, no discriminator loss, no validation detail.

Plain inputs only (DataFrames, dicts, paths): no Prefect or MLflow here; a flow wires them.
Figures are drawn on `matplotlib.figure.Figure` objects (Agg canvas), never through pyplot's global
state, so building reports from several threads or processes is safe.
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from dpsynth.models.data.encoding import TableEncoder, level_codes
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.quality import (
    feature_stats,
    level_frequencies,
    real_data_importance,
    significance_stars,
    spearman_mad,
    spearman_matrix,
    subsample,
    tvd_by_feature,
    wasserstein_by_feature,
)
from dpsynth.models.privacy.statement import HEADING as EPSILON_HEADING
from dpsynth.models.privacy.statement import PrivacyStatement
from dpsynth.tasks.evaluate import RESULT_COLUMNS

REAL_SETTING = "real"
BASELINE_SETTING = "baseline"
# Optional per-run level-share columns in the results table: "share:<column>=<level>".
SHARE_PREFIX = "share:"

# Privacy keys the release notes may show (public configuration and accountant output). Anything else
# in the `privacy` dict appears in the internal report only.
PUBLIC_PRIVACY_KEYS = {
    "generator": "generator",
    "mechanism": "mechanism",
    "accountant": "accountant",
    "conversion": "RDP to (epsilon, delta) conversion",
    "sampling": "sampling",
    "adjacency": "adjacency",
    "unit": "unit of privacy",
    "delta": "delta",
    "noise_multiplier": "noise multiplier sigma",
    "sigma": "noise multiplier sigma",
    "clip": "clipping norm C",
    "C": "clipping norm C",
    "batch_size": "batch size B",
    "iterations": "generator iterations (planned)",
    "checkpoint_every": "checkpoint every (iterations)",
    "epsilon_budget": "epsilon budget",
    "target_labels": "target column",
    "K": "discriminators K",
    "discriminator_draw": "discriminator draw",
    "discriminator_refresh": "discriminator refresh schedule",
    "q": "sampling rate q",
    "label_prior": "label prior (share of target label 1)",
    "q1": "autoencoder sampling rate q1",
    "sigma1": "autoencoder noise multiplier sigma1",
    "C1": "autoencoder clipping norm C1",
    "q3": "critic sampling rate q3",
    "sigma3": "critic noise multiplier sigma3",
    "C3": "critic clipping norm C3",
    "updates_per_generator_step": "critic updates per generator step",
    "autoencoder_steps": "autoencoder steps",
    "latent_model": "latent model",
    "sigma_latent": "Gaussian fit's noise multiplier",
    "sigma_moments": "moment query's noise multiplier",
}
PUBLIC_SETTING_KEYS = ("generator", "discriminators", "K", "gamma", "private", "iterations", "last_iteration",
                       "epsilon_budget")


# ---- formatting --------------------------------------------------------------------------------------------


def format_number(value, digits: int = 4) -> str:
    """Fixed-point text for a number: '' for missing, 'inf' for infinity, integers as they are."""
    if value is None:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value):
            return ""
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.{digits}f}"
    return str(value)


def _fmt_general(value) -> str:
    if isinstance(value, (float, np.floating)) and math.isfinite(value):
        return f"{float(value):g}"
    return format_number(value)


def _is_finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


# ---- a tiny document model rendered to HTML or Markdown ----------------------------------------------------


@dataclass
class _Table:
    header: list[str]
    rows: list[list[str]]
    highlight: set[tuple[int, int]] = field(default_factory=set)  # (row, column) cells to mark
    caption: str = ""


@dataclass
class _Doc:
    blocks: list[tuple] = field(default_factory=list)

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("heading", level, text))

    def paragraph(self, text: str) -> None:
        self.blocks.append(("paragraph", text))

    def warning(self, text: str) -> None:
        self.blocks.append(("warning", text))

    def bullets(self, items) -> None:
        self.blocks.append(("bullets", list(items)))

    def table(self, table: _Table) -> None:
        self.blocks.append(("table", table))

    def image(self, png: bytes, caption: str) -> None:
        self.blocks.append(("image", png, caption))

    # -- renderers
    def to_html(self, title: str, banner: str | None = None) -> str:
        esc = _esc
        out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
               f"<title>{esc(title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>"]
        if banner:
            out.append(f'<div class="banner">{esc(banner)}</div>')
        out.append(f"<h1>{esc(title)}</h1>")
        for block in self.blocks:
            kind = block[0]
            if kind == "heading":
                out.append(f"<h{block[1] + 1}>{esc(block[2])}</h{block[1] + 1}>")
            elif kind == "paragraph":
                out.append(f"<p>{esc(block[1])}</p>")
            elif kind == "warning":
                out.append(f'<p class="warning">{esc(block[1])}</p>')
            elif kind == "bullets":
                out.append("<ul>" + "".join(f"<li>{esc(item)}</li>" for item in block[1]) + "</ul>")
            elif kind == "table":
                out.append(_table_html(block[1]))
            elif kind == "image":
                data = base64.b64encode(block[1]).decode("ascii")
                out.append(f'<figure><img alt="{esc(block[2], True)}" src="data:image/png;base64,{data}">'
                           f"<figcaption>{esc(block[2])}</figcaption></figure>")
        if banner:
            out.append(f'<div class="banner">{esc(banner)}</div>')
        out += ["</body>", "</html>", ""]
        return "\n".join(out)

    def to_markdown(self, title: str) -> str:
        out = [f"# {title}", ""]
        for block in self.blocks:
            kind = block[0]
            if kind == "heading":
                out += ["#" * (block[1] + 1) + " " + block[2], ""]
            elif kind == "paragraph":
                out += [block[1], ""]
            elif kind == "warning":
                out += [f"**{block[1]}**", ""]
            elif kind == "bullets":
                out += [f"- {item}" for item in block[1]] + [""]
            elif kind == "table":
                out += [_table_markdown(block[1]), ""]
            elif kind == "image":  # the published notes carry no figures; keep the caption only
                out += [f"*{block[2]}*", ""]
        return "\n".join(out)


_CSS = """
body { font-family: sans-serif; max-width: 1200px; margin: 1em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 2px 6px; text-align: right; }
th { background: #eee; } td:first-child, th:first-child { text-align: left; }
caption { caption-side: top; text-align: left; font-weight: bold; padding: 4px 0; }
td.vanished { background: #f8b4b4; font-weight: bold; }
.banner { background: #b00020; color: white; font-weight: bold; padding: 0.6em 1em; margin: 0.5em 0; }
.warning { background: #fff0f0; border: 2px solid #b00020; color: #7a0015; font-weight: bold; padding: 0.4em; }
figure { margin: 1em 0; } figure img { max-width: 100%; } figcaption { font-size: 0.85em; color: #555; }
"""


def _esc(text, quote: bool = False) -> str:
    return html.escape(str(text), quote=quote)


def _table_html(table: _Table) -> str:
    out = ["<table>"]
    if table.caption:
        out.append(f"<caption>{_esc(table.caption)}</caption>")
    out.append("<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in table.header) + "</tr>")
    for i, row in enumerate(table.rows):
        cells = []
        for j, cell in enumerate(row):
            cls = ' class="vanished"' if (i, j) in table.highlight else ""
            cells.append(f"<td{cls}>{_esc(cell)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _table_markdown(table: _Table) -> str:
    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = []
    if table.caption:
        lines += [f"*{table.caption}*", ""]
    lines.append("| " + " | ".join(cell(h) for h in table.header) + " |")
    lines.append("|" + "|".join(" --- " for _ in table.header) + "|")
    for row in table.rows:
        lines.append("| " + " | ".join(cell(c) for c in row) + " |")
    return "\n".join(lines)


def _frame_table(frame: pd.DataFrame, digits: int | dict = 4, index: bool = True, caption: str = "",
                 index_name: str = "") -> _Table:
    header = ([index_name or (frame.index.name or "")] if index else []) + [str(c) for c in frame.columns]
    rows = []
    for label, values in zip(frame.index, frame.itertuples(index=False)):
        row = [str(label)] if index else []
        for column, value in zip(frame.columns, values):
            d = digits.get(column, 4) if isinstance(digits, dict) else digits
            row.append(format_number(value, d))
        rows.append(row)
    return _Table(header, rows, caption=caption)


def _mapping_table(mapping: dict, key_header: str = "item", value_header: str = "value") -> _Table:
    """A dict as a table: scalars as key/value rows, a dict of dicts as one row per key."""
    if mapping and all(isinstance(v, dict) for v in mapping.values()):
        frame = pd.DataFrame.from_dict(mapping, orient="index")
        frame = frame.astype(object).where(frame.notna(), None)
        table = _frame_table(frame, digits=4, index_name=key_header)
        return table
    rows = [[str(k), _fmt_general(v) if not isinstance(v, (list, tuple)) else ", ".join(map(_fmt_general, v))]
            for k, v in mapping.items()]
    return _Table([key_header, value_header], rows)


def _epsilon_statement(doc: _Doc, statement: PrivacyStatement) -> None:
    doc.heading(1, EPSILON_HEADING)
    doc.paragraph(statement.covers)
    doc.paragraph("Epsilon does NOT cover:")
    doc.bullets(list(statement.does_not_cover) or ["nothing else."])
    doc.paragraph(statement.internal_only)


# ---- figures -----------------------------------------------------------------------------------------------


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
    if _is_finite(entry.get("test_auc")):
        return float(entry["test_auc"])
    return float(rows["test_auc"].max())


def _auc_figure(results: pd.DataFrame, chosen: dict, thesis_reference: dict | None) -> bytes:
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    data = results.dropna(subset=["test_auc"])
    settings = [s for s in dict.fromkeys(data["setting"]) if s != REAL_SETTING]
    for i, setting in enumerate(settings):
        rows = data[data["setting"] == setting]
        if _non_private(rows):
            value = _line_value(setting, rows, chosen)
            label = ("non-private baseline" if setting == BASELINE_SETTING else setting) + f" ({value:.3f})"
            ax.axhline(value, color="dimgray", linestyle=":", linewidth=1.5, label=label)
            continue
        rows = rows[np.isfinite(rows["epsilon"].astype(float))].sort_values("epsilon")
        ax.plot(rows["epsilon"], rows["test_auc"], marker="o", markersize=3, linewidth=1, color=_color(i),
                label=setting)
        pick = chosen.get(setting) or {}
        if _is_finite(pick.get("epsilon")) and _is_finite(pick.get("test_auc")):
            ax.scatter([pick["epsilon"]], [pick["test_auc"]], marker="*", s=180, color=_color(i),
                       edgecolors="black", zorder=5)
    real = data[data["setting"] == REAL_SETTING]
    if not real.empty:
        mean = float(real["test_auc"].mean())
        ax.axhline(mean, color="black", linestyle="--", linewidth=1.5, label=f"real data (mean {mean:.3f})")
    for label, entry in (thesis_reference or {}).items():
        if isinstance(entry, dict) and _is_finite(entry.get("auc")) and _is_finite(entry.get("epsilon")):
            ax.scatter([float(entry["epsilon"])], [float(entry["auc"])], marker="x", color="gray", zorder=4)
            ax.annotate(f"thesis: {label}", (float(entry["epsilon"]), float(entry["auc"])), fontsize=7,
                        color="gray", xytext=(-4, -12), textcoords="offset points", ha="right")
    ax.set_xlabel("epsilon (delta as configured)")
    ax.set_ylabel("AUC on the real test split")
    ax.set_title("Figure 7.1: AUC against epsilon (star: chosen checkpoint)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower right")
    return _png(fig)


def _hist_figure(schema: DatasetSchema, real: pd.DataFrame | None, synth: pd.DataFrame, setting: str) -> bytes:
    columns = schema.continuous
    fig = Figure(figsize=(3.0 * max(len(columns), 1), 2.8), layout="constrained")
    for i, col in enumerate(columns):
        ax = fig.add_subplot(1, max(len(columns), 1), i + 1)
        bins = np.linspace(col.bounds[0], col.bounds[1], 41)
        if real is not None:
            values = pd.to_numeric(real[col.name], errors="coerce").dropna()
            ax.hist(values, bins=bins, density=True, color="gray", alpha=0.5, label="real")
        values = pd.to_numeric(synth[col.name], errors="coerce").dropna()
        ax.hist(values, bins=bins, density=True, histtype="step", linewidth=1.5, color="C0", label=setting)
        ax.set_title(f"{col.name}" + (f" ({col.unit})" if col.unit else ""), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_yticks([])
        if i == 0:
            ax.legend(fontsize=7)
    fig.suptitle(f"Figure 7.2: continuous features, real vs synthetic ({setting})", fontsize=10)
    return _png(fig)


def _heatmap_figure(rho: pd.DataFrame, pval: pd.DataFrame, title: str) -> bytes:
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
            ax.text(j, i, text, ha="center", va="center", fontsize=6,
                    color="white" if np.isfinite(r) and abs(r) > 0.6 else "black")
    fig.colorbar(image, ax=ax, shrink=0.8)
    ax.set_title(title, fontsize=9)
    return _png(fig)


def _frequency_figure(schema: DatasetSchema, shares: dict[str, dict[str, dict[str, float]]]) -> bytes:
    """Grouped bars per discrete column; `shares` maps a series name (real, a setting) to its shares."""
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


# ---- vanished levels ---------------------------------------------------------------------------------------


def flatten_level_shares(level_shares: dict[str, dict[str, float]]) -> dict[str, float]:
    """{column: {level: share}} as results-table columns {"share:<column>=<level>": share}."""
    return {f"{SHARE_PREFIX}{col}={level}": float(share)
            for col, levels in level_shares.items() for level, share in levels.items()}


def _normalise_chosen(chosen) -> dict[str, dict]:
    """{setting: plain dict} from dicts or pandas Series (as `choose_checkpoint` returns); drops None."""
    out = {}
    for setting, entry in (chosen or {}).items():
        if entry is None or (isinstance(entry, dict) and not entry):
            continue
        out[str(setting)] = {str(k): v for k, v in dict(entry.items()).items()}
    return out


def _chosen_iteration(chosen: dict, setting: str):
    entry = chosen.get(setting) or {}
    it = entry.get("iteration")
    return None if it is None or (isinstance(it, float) and math.isnan(it)) else int(it)


def vanished_levels(schema: DatasetSchema, ledger_level_shares: dict, chosen: dict | None = None,
                    results: pd.DataFrame | None = None) -> list[dict]:
    """Every (setting, iteration, column, level) whose share is 0 at a checkpoint.

    Sources: the ledger's per-checkpoint level shares (generated samples, DP-covered) and optional
    "share:<column>=<level>" columns of the results table. A declared level missing from a column's
    recorded shares counts as 0. Each finding: dict(setting, iteration, column, level, chosen, source).
    """
    chosen = _normalise_chosen(chosen)
    found: dict[tuple, dict] = {}

    def add(setting, iteration, column, level, source):
        key = (setting, int(iteration), column, str(level))
        if key not in found:
            found[key] = {"setting": setting, "iteration": int(iteration), "column": column, "level": str(level),
                          "chosen": _chosen_iteration(chosen, setting) == int(iteration), "source": source}

    for setting, entries in (ledger_level_shares or {}).items():
        for entry in entries or []:
            shares = entry.get("level_shares") or {}
            for col in schema.discrete:
                if col.name not in shares:
                    continue
                for level in col.levels:
                    value = shares[col.name].get(str(level), 0.0)
                    if value is None or float(value) <= 0.0:
                        add(setting, entry["iteration"], col.name, level, "ledger")
    if results is not None and not results.empty:
        share_columns = [c for c in results.columns if str(c).startswith(SHARE_PREFIX)]
        for column in share_columns:
            name, _, level = str(column)[len(SHARE_PREFIX):].partition("=")
            zero = results[pd.to_numeric(results[column], errors="coerce") <= 0.0]
            for _, row in zero.iterrows():
                add(row["setting"], row["iteration"], name, level, "results")
    return sorted(found.values(), key=lambda f: (not f["chosen"], str(f["setting"]), f["column"], f["level"],
                                                 f["iteration"]))


def level_warnings(schema: DatasetSchema, ledger_level_shares: dict, chosen: dict | None = None,
                   results: pd.DataFrame | None = None,
                   synthetic_frames: dict[str, pd.DataFrame] | None = None) -> list[str]:
    """One WARNING line per vanished level: first those at a chosen checkpoint, then one line per
    (setting, column, level) listing the checkpoints, then levels absent from a synthetic table."""
    findings = vanished_levels(schema, ledger_level_shares, chosen, results)
    lines = [f"WARNING (CHOSEN CHECKPOINT): setting {f['setting']}, iteration {f['iteration']}: level "
             f"{f['level']!r} of column {f['column']!r} vanished (share 0)." for f in findings if f["chosen"]]
    grouped: dict[tuple, list[int]] = {}
    for f in findings:
        grouped.setdefault((f["setting"], f["column"], f["level"]), []).append(f["iteration"])
    for (setting, column, level), iterations in grouped.items():
        iterations = sorted(set(iterations))
        lines.append(f"WARNING: setting {setting}: level {level!r} of column {column!r} vanished (share 0) at "
                     f"{len(iterations)} checkpoint(s): iterations {', '.join(map(str, iterations))}.")
    for setting, frame in (synthetic_frames or {}).items():
        for column, shares in level_frequencies(schema, frame).items():
            for level, share in shares.items():
                if share <= 0.0:
                    lines.append(f"WARNING: the synthetic table of setting {setting} has no row with level "
                                 f"{level!r} of column {column!r}.")
    return lines


def _level_share_table(schema: DatasetSchema, entries: list[dict], chosen_iteration) -> _Table:
    keys = [(col.name, str(level)) for col in schema.discrete for level in col.levels]
    header = ["iteration"] + [f"{c}={lvl}" for c, lvl in keys]
    rows, highlight = [], set()
    for i, entry in enumerate(sorted(entries, key=lambda e: e["iteration"])):
        shares = entry.get("level_shares") or {}
        label = str(entry["iteration"]) + (" (chosen)" if entry["iteration"] == chosen_iteration else "")
        row = [label]
        for j, (column, level) in enumerate(keys):
            if column not in shares:
                row.append("")
                continue
            value = shares[column].get(level, 0.0)
            value = 0.0 if value is None else float(value)
            row.append(format_number(value, 3))
            if value <= 0.0:
                highlight.add((i, j + 1))
        rows.append(row)
    return _Table(header, rows, highlight)


# ---- the internal report -----------------------------------------------------------------------------------


INTERNAL_BANNER = ("INTERNAL - contains real-data statistics (AUCs measured on real data, real distributions, "
                   "correlations, importances, imputation counts). For the data steward only: never publish. "
                   "The publishable document is the release notes.")


def _complete_rows(schema: DatasetSchema, frame: pd.DataFrame) -> pd.DataFrame:
    """Rows with every schema value present and valid (what the encoder accepts)."""
    keep = np.ones(len(frame), dtype=bool)
    for col in schema.columns:
        if col.is_continuous:
            keep &= pd.to_numeric(frame[col.name], errors="coerce").notna().to_numpy()
        else:
            keep &= level_codes(col, frame[col.name].to_numpy()) >= 0
    return frame.loc[keep, schema.column_names]


def _sort_results(results: pd.DataFrame) -> pd.DataFrame:
    columns = [c for c in RESULT_COLUMNS if c in results.columns]
    columns += [c for c in results.columns if c not in columns]
    order = [c for c in ("setting", "iteration", "index") if c in results.columns]
    return results[columns].sort_values(order, kind="stable") if order else results[columns]


def build_internal_report(path, *, title: str, schema: DatasetSchema, results: pd.DataFrame,
                          chosen: dict[str, dict], real_frame: pd.DataFrame | None,
                          synthetic_frames: dict[str, pd.DataFrame],
                          ledger_level_shares: dict[str, list[dict]], privacy: dict,
                          statement: PrivacyStatement,
                          imputation_counts: dict | None = None, thesis_reference: dict | None = None,
                          membership: dict | None = None, comparison: dict | None = None,
                          max_rows: int | None = 20000, seed: int = 0) -> Path:
    """Write the INTERNAL report: one self-contained HTML file (figures embedded). Returns its path.

    results: one row per selection run, columns of `dpsynth.tasks.evaluate.RESULT_COLUMNS` (optionally
    "share:<column>=<level>" columns); setting "real" is the real-vs-real baseline, a setting named
    "baseline" with non-finite epsilon the non-private GAN. chosen: {setting: {iteration, epsilon,
    test_auc}}. real_frame: the real table (decoded, schema columns) or None. synthetic_frames:
    {setting: synthetic table} (typically the chosen checkpoint's sample). ledger_level_shares:
    {setting: [{iteration, level_shares: {column: {level: share}}}]}. privacy: mechanism, delta,
    noise_multiplier (sigma), clip (C), batch_size, iterations, settings {name: {discriminators, private}}.
    imputation_counts: {column: count or {kind: count}}. thesis_reference: {label: {auc, epsilon, ...}}.
    Quality statistics use at most `max_rows` rows per table (drawn with `seed`).
    """
    path = Path(path)
    chosen = _normalise_chosen(chosen)
    synthetic_frames = synthetic_frames or {}
    ledger_level_shares = ledger_level_shares or {}
    results = results if results is not None else pd.DataFrame(columns=RESULT_COLUMNS)
    real = subsample(real_frame, max_rows, seed) if real_frame is not None else None
    synths = {name: subsample(frame, max_rows, seed) for name, frame in synthetic_frames.items()}
    doc = _Doc()

    doc.paragraph(f"Dataset {schema.name} (schema version {schema.version}). Generated "
                  f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}.")
    warnings_ = level_warnings(schema, ledger_level_shares, chosen, results, synthetic_frames)
    doc.heading(1, "Warnings")
    if warnings_:
        for line in warnings_:
            doc.warning(line)
    else:
        doc.paragraph("No level of a binary or categorical column vanished at any recorded checkpoint.")

    _epsilon_statement(doc, statement)

    doc.heading(1, "Privacy parameters")
    scalars = {k: v for k, v in privacy.items() if not isinstance(v, dict)}
    doc.table(_mapping_table(scalars, "parameter"))
    for key, value in privacy.items():
        if isinstance(value, dict) and value:
            doc.paragraph(f"{key}:")
            doc.table(_mapping_table(value, key.rstrip("s") or key))

    doc.heading(1, "Chosen checkpoints")
    doc.paragraph("A release: the checkpoint its differentially private choice drew, at the whole release's "
                  "epsilon. An experiment: per setting, the lowest-epsilon checkpoint whose AUC is close to the "
                  "setting's best (thesis Figure 7.1), at that checkpoint's training epsilon. The test AUC is "
                  "measured on real test rows: internal only.")
    if chosen:
        frame = pd.DataFrame.from_dict(chosen, orient="index")
        frame = frame[[c for c in ("iteration", "epsilon", "test_auc") if c in frame.columns]
                      + [c for c in frame.columns if c not in ("iteration", "epsilon", "test_auc")]]
        doc.table(_frame_table(frame.astype(object), {"epsilon": 3}, index_name="setting"))
    else:
        doc.paragraph("No checkpoint was chosen.")
    if comparison:
        doc.heading(1, "Generators compared")
        doc.paragraph("Each setting's chosen checkpoint, with what publishing it costs (epsilon), its AUC on real "
                      "test rows, and its sample quality against the real training rows: Spearman mean absolute "
                      "difference over feature pairs, mean total-variation distance over discrete features, mean "
                      "Wasserstein distance over continuous features scaled to [0, 1] by their public bounds.")
        doc.table(_frame_table(pd.DataFrame.from_dict(comparison, orient="index").astype(object),
                               {"epsilon": 3, "test_auc": 4, "spearman_mad": 4, "mean_tvd": 4,
                                "mean_wasserstein": 4}, index_name="setting"))

    doc.heading(1, "Figure 7.1: utility against privacy")
    if not results.empty and results["test_auc"].notna().any():
        doc.image(_auc_figure(results, chosen, thesis_reference),
                  "AUC on the real test split of logistic regression trained on synthetic rows, per checkpoint; "
                  "dashed: real data (mean over real-vs-real runs); dotted: non-private baseline.")
    else:
        doc.paragraph("No AUC recorded.")

    rho_real = pval_real = None
    if real is not None:
        rho_real, pval_real = spearman_matrix(schema, real, max_rows=None)
    spearman = {name: spearman_matrix(schema, frame, max_rows=None) for name, frame in synths.items()}

    doc.heading(1, "Sample quality against the real table")
    if real is not None and synths:
        summary, w_rows, t_rows = {}, {}, {}
        for name, frame in synths.items():
            w = wasserstein_by_feature(schema, real, frame)
            t = tvd_by_feature(schema, real, frame)
            w_rows[name], t_rows[name] = w, t
            summary[name] = {"mean Wasserstein (bounds-scaled)": w.mean(), "mean TVD": t.mean(),
                             "Spearman MAD": spearman_mad(rho_real, spearman[name][0])}
        doc.table(_frame_table(pd.DataFrame.from_dict(summary, orient="index"), 4, index_name="setting"))
        doc.table(_frame_table(pd.DataFrame(w_rows).T, 4, index_name="setting",
                               caption="Wasserstein distance per continuous feature (values scaled to [0, 1] "
                                       "by the public bounds)"))
        doc.table(_frame_table(pd.DataFrame(t_rows).T, 4, index_name="setting",
                               caption="Total-variation distance per binary/categorical feature"))
    else:
        doc.paragraph("Needs the real table and at least one synthetic table.")

    doc.heading(1, "Figure 7.2: continuous-feature distributions")
    for name, frame in synths.items():
        doc.image(_hist_figure(schema, real, frame, name),
                  f"Histograms over the public bounds (40 bins): real (gray) vs synthetic {name}.")

    doc.heading(1, "Table 7.2: mean and standard deviation of continuous features")
    stats_columns = {}
    if real is not None:
        s = feature_stats(schema, real)
        stats_columns["real mean"], stats_columns["real std"] = s["mean"], s["std"]
    for name, frame in synths.items():
        s = feature_stats(schema, frame)
        stats_columns[f"{name} mean"], stats_columns[f"{name} std"] = s["mean"], s["std"]
    if stats_columns:
        doc.table(_frame_table(pd.DataFrame(stats_columns), 3, index_name="feature"))

    doc.heading(1, "Figure 7.3: Spearman rank correlations")
    doc.paragraph("Categorical columns enter as their level codes. Stars: *** p < 0.001, ** p < 0.01, "
                  "* p < 0.05. MAD: mean absolute difference from the real matrix over the off-diagonal "
                  "upper triangle.")
    if rho_real is not None:
        doc.image(_heatmap_figure(rho_real, pval_real, "real"), "Spearman correlations of the real table.")
    for name, (rho, pval) in spearman.items():
        mad = f" (MAD from real {spearman_mad(rho_real, rho):.4f})" if rho_real is not None else ""
        doc.image(_heatmap_figure(rho, pval, f"{name}{mad}"), f"Spearman correlations of synthetic {name}{mad}.")

    doc.heading(1, "Figure 7.4: level shares of binary and categorical features")
    shares = {}
    if real is not None:
        shares[REAL_SETTING] = level_frequencies(schema, real)
    for name, frame in synths.items():
        shares[name] = level_frequencies(schema, frame)
    if shares:
        doc.image(_frequency_figure(schema, shares), "Share of each declared level: real (gray) and synthetic.")
        rows = {f"{col}={level}": {name: s.get(col, {}).get(level) for name, s in shares.items()}
                for col in (c.name for c in schema.discrete)
                for level in dict.fromkeys(lvl for s in shares.values() for lvl in s.get(col, {}))}
        doc.table(_frame_table(pd.DataFrame.from_dict(rows, orient="index").astype(object), 4, index_name="level"))

    doc.heading(1, "Table 7.1: feature importance on the real data")
    if real is not None:
        complete = _complete_rows(schema, real)
        try:
            encoder = TableEncoder(schema)
            importance = real_data_importance(schema, encoder, encoder.encode(complete), seed)
            doc.paragraph(f"Logistic regression (l2, C = 1) coefficients on the [-1, 1] encoded features and "
                          f"random-forest importances (50 trees, depth 5), fitted on {len(complete)} real rows.")
            doc.table(_frame_table(importance, 4, index_name="feature"))
        except ValueError as exc:
            doc.paragraph(f"Not computed: {exc}.")
    else:
        doc.paragraph("No real table given.")

    doc.heading(1, "Level shares at every checkpoint")
    doc.paragraph("Shares of generated samples recorded in each setting's ledger. Highlighted: a level "
                  "that vanished (share 0).")
    for setting, entries in ledger_level_shares.items():
        entries = [e for e in entries or [] if e.get("level_shares")]
        if entries:
            doc.heading(2, f"Setting {setting}")
            doc.table(_level_share_table(schema, entries, _chosen_iteration(chosen, setting)))

    if imputation_counts:
        doc.heading(1, "KNN imputation (counts: internal)")
        doc.table(_mapping_table(imputation_counts, "column", "values imputed"))

    if membership:
        _membership_section(doc, membership)

    if thesis_reference:
        doc.heading(1, "Thesis reference values")
        doc.table(_mapping_table(thesis_reference, "system"))

    doc.heading(1, "Model selection: every run")
    if not results.empty:
        table = _sort_results(results)
        doc.table(_frame_table(table.astype(object), {"epsilon": 3, "C": 6, "seconds": 2}, index=False))
    else:
        doc.paragraph("No selection run recorded.")

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc.to_html(f"{title} (INTERNAL)", INTERNAL_BANNER), encoding="utf-8")
    return path


def _membership_section(doc: _Doc, membership: dict) -> None:
    doc.heading(1, "Membership inference against the chosen checkpoints")
    doc.paragraph("Members: the generator's training rows; non-members: the real test rows, which nothing "
                  "published depends on; equally many of each. DCR: the share of synthetic rows whose nearest "
                  "real row is a member (1/2: no preference for training rows). Attacks: the AUC of telling "
                  "members from non-members from the synthetic table alone, by the distance to the nearest "
                  "synthetic row, and by the synthetic over the reference (validation rows) density "
                  "(DOMIAS-style); 0.5 is chance. Intervals: 95%.")
    rows = []
    for setting, m in membership.items():
        dcr, near, ratio = m["dcr"], m["nearest_synthetic_auc"], m["density_ratio_auc"]
        rows.append([str(setting), format_number(m["rows_each"]),
                     f"{dcr['share_closer_to_members']:.3f} [{dcr['low']:.3f}, {dcr['high']:.3f}]",
                     f"{near['auc']:.3f} [{near['low']:.3f}, {near['high']:.3f}]",
                     f"{ratio['auc']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]"])
    doc.table(_Table(["setting", "rows of each", "DCR member share", "nearest-synthetic attack AUC",
                      "density-ratio attack AUC"], rows))


# ---- the release notes (published) -------------------------------------------------------------------------


def _release_doc(schema: DatasetSchema, synthetic_frame: pd.DataFrame, privacy: dict, chosen: dict,
                 ledger: list[dict], statement: PrivacyStatement) -> _Doc:
    doc = _Doc()
    doc.paragraph("Published release notes. Every number below is either public configuration, the output of "
                  "the privacy accountant, or a statistic of the released synthetic table (post-processing of "
                  "the differentially private generator). No real row and no statistic of the real table is "
                  "included.")

    doc.heading(1, "Privacy guarantee")
    picks = _normalise_chosen(chosen)
    for setting, entry in picks.items():
        eps = entry.get("epsilon")
        eps_text = format_number(float(eps), 3) if eps is not None else ""
        private = _is_finite(eps)
        doc.paragraph(f"Setting {setting}, checkpoint at iteration {entry.get('iteration')}: "
                      + (f"(epsilon, delta) = ({eps_text}, {_fmt_general(privacy.get('delta'))})-differential "
                         f"privacy for the whole release, unit of privacy one row." if private else
                         "NOT differentially private (non-private setting, epsilon = inf)."))
    public = {PUBLIC_PRIVACY_KEYS[k]: v for k, v in privacy.items()
              if k in PUBLIC_PRIVACY_KEYS and not isinstance(v, dict)}
    if public:
        doc.table(_mapping_table(public, "parameter"))
    settings = privacy.get("settings")
    if isinstance(settings, dict) and settings:
        doc.paragraph("Settings (for GS-WGAN, gamma = 1/K: each generated row queries one of K discriminators):")
        doc.table(_mapping_table({name: {k: v for k, v in (spec or {}).items() if k in PUBLIC_SETTING_KEYS}
                                  for name, spec in settings.items()}, "setting"))

    doc.heading(1, "Released checkpoint")
    doc.table(_Table(["setting", "iteration", "epsilon"],
                     [[str(s), format_number(e.get("iteration")), format_number(e.get("epsilon"), 3)]
                      for s, e in picks.items()]))

    doc.heading(1, "Epsilon ledger")
    doc.paragraph("Epsilon spent by training up to each checkpoint (the accountant's output). Every checkpoint up "
                  "to the last was trained and considered, so the release costs at least the last one's, combined "
                  "with the choice as stated above.")
    doc.table(_Table(["iteration", "epsilon"],
                     [[format_number(entry.get("iteration")), format_number(entry.get("epsilon"), 3)]
                      for entry in sorted(ledger or [], key=lambda e: e.get("iteration", 0))]))

    _epsilon_statement(doc, statement)

    doc.heading(1, "The synthetic table")
    frame = synthetic_frame
    doc.paragraph(f"{len(frame)} synthetic rows, {len(schema.columns)} columns, sampled from the released "
                  f"generator. Statistics below are of this synthetic table only.")
    doc.table(_frame_table(feature_stats(schema, frame), 3, index_name="continuous feature",
                           caption="Mean and standard deviation (synthetic)"))
    rows = [[col, level, format_number(share, 4)]
            for col, levels in level_frequencies(schema, frame).items() for level, share in levels.items()]
    doc.table(_Table(["column", "level", "share (synthetic)"], rows))

    doc.heading(1, "Schema (public)")
    doc.table(_Table(["column", "type", "bounds or levels", "unit"],
                     [[c.name, c.kind + (" (target)" if c.name == schema.target else ""),
                       (f"[{_fmt_general(c.bounds[0])}, {_fmt_general(c.bounds[1])}]" if c.is_continuous
                        else ", ".join(map(str, c.levels))), c.unit] for c in schema.columns]))
    return doc


def build_release_notes(path, *, title: str, schema: DatasetSchema, synthetic_frame: pd.DataFrame, privacy: dict,
                        chosen: dict, ledger: list[dict], statement: PrivacyStatement) -> Path:
    """Write the published release notes as Markdown. DP-covered and public content only.

    From `chosen` only each setting's iteration and epsilon are used (never its AUC); from `ledger`
    only iteration and epsilon; from `privacy` only the keys of PUBLIC_PRIVACY_KEYS and the settings'
    PUBLIC_SETTING_KEYS.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_release_doc(schema, synthetic_frame, privacy, chosen, ledger, statement).to_markdown(title),
                    encoding="utf-8")
    return path


def build_release_notes_html(path, *, title: str, schema: DatasetSchema, synthetic_frame: pd.DataFrame,
                             privacy: dict, chosen: dict, ledger: list[dict], statement: PrivacyStatement) -> Path:
    """The same release notes as one HTML file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_release_doc(schema, synthetic_frame, privacy, chosen, ledger, statement).to_html(title),
                    encoding="utf-8")
    return path


# ---- small internal summaries (Prefect artifacts) ----------------------------------------------------------


__all__ = [
    "build_internal_report",
    "build_release_notes",
    "build_release_notes_html",
    "flatten_level_shares",
    "format_number",
    "level_warnings",
    "vanished_levels",
]
