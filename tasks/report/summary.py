"""The internal report's first screen: the answer before the sections.

Per chosen setting: its epsilon and delta, one plain sentence of what epsilon covers (the privacy
statement without its parenthesised detail), the AUC of synthetic rows on the real test split beside the
real data's, the fidelity figures against the real table with traffic lights (green: target met, amber:
within twice the target, red: worse; targets from `dpsynth.models.evaluation.fidelity`), SDMetrics'
quality scores for comparison with other tools, and the warnings. Internal: every AUC and fidelity figure
depends on real rows.
"""

from __future__ import annotations

import re

import pandas as pd

from dpsynth.models.evaluation.fidelity import (
    AMBER,
    AMBER_FACTOR,
    FIDELITY_TARGETS,
    GREEN,
    MISSED,
    RED,
    fidelity_verdicts,
)
from dpsynth.models.privacy.statement import HEADING as EPSILON_HEADING
from dpsynth.models.privacy.statement import PrivacyStatement
from dpsynth.tasks.report.document import Heading, Panel, Paragraph, Table, WarningLine
from dpsynth.tasks.report.figures import REAL_SETTING
from dpsynth.tasks.report.formatting import format_general, format_number, is_finite, iteration_label

SUMMARY_ID = "summary"
SUMMARY_HEADING = "Summary: epsilon, AUC and fidelity against the real table"

# How each light reads in a cell (the colour is the cell's class; the word keeps it readable in grey).
LIGHT_WORDS = {GREEN: "met", AMBER: f"within {AMBER_FACTOR:g}x", RED: "missed"}

# The rows of the fidelity table: (figure of the fidelity summary, what a reader calls it, the summary key
# naming where the figure is worst, if any).
FIDELITY_ROWS = (
    ("categorical_tvd_mean", "categorical TVD, mean over columns", None),
    ("categorical_tvd_worst", "categorical TVD, worst column", "categorical_tvd_worst_column"),
    ("continuous_tvd_mean", "continuous TVD (bins of the public bounds), mean", None),
    ("pairwise_tvd_mean", "2-way TVD (public cells), mean over column pairs", None),
    ("pairwise_tvd_worst", "2-way TVD (public cells), worst pair", "pairwise_tvd_worst_pair"),
    (
        "continuous_quantile_tvd_worst",
        "numeric TVD (cells at the real quantiles), worst",
        "continuous_quantile_tvd_worst_column",
    ),
    ("continuous_ks_worst", "numeric KS distance, worst", "continuous_ks_worst_column"),
    ("pairwise_quantile_tvd_mean", "2-way TVD (numeric on real-quantile cells), mean", None),
    (
        "pairwise_quantile_tvd_worst",
        "2-way TVD (numeric on real-quantile cells), worst",
        "pairwise_quantile_tvd_worst_pair",
    ),
    ("lost_levels", "levels lost (at least 1% of real rows, none synthetic)", None),
    ("point_mass_gap_max", "point-mass gap, largest", None),
    ("spearman_mad_continuous", "Spearman MAD, continuous columns", None),
)
SDMETRICS_ROWS = (
    ("column_shapes", "SDMetrics Column Shapes (1 is best)"),
    ("column_pair_trends", "SDMetrics Column Pair Trends (1 is best)"),
    ("overall", "SDMetrics overall quality (1 is best)"),
)
FIGURE_LABELS = {figure: label for figure, label, _ in FIDELITY_ROWS}
MAX_LEVELS_LISTED = 6


def plain_coverage(statement: PrivacyStatement) -> str:
    """The statement of what epsilon covers without its parenthesised detail: one plain sentence."""
    depth, kept = 0, []
    for char in statement.covers:
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(char)
    text = re.sub(r"\s+", " ", "".join(kept))
    return re.sub(r" ([,.;:])", r"\1", text).strip()


def _real_auc(results: pd.DataFrame) -> float | None:
    if results.empty or "setting" not in results.columns:
        return None
    aucs = pd.to_numeric(results.loc[results["setting"] == REAL_SETTING, "test_auc"], errors="coerce").dropna()
    return float(aucs.mean()) if len(aucs) else None


def _released_table(chosen: dict[str, dict], privacy: dict, real_auc: float | None) -> Table:
    rows = []
    for setting, entry in chosen.items():
        epsilon = entry.get("epsilon")
        private = is_finite(epsilon)
        rows.append(
            [
                str(setting),
                iteration_label(entry.get("iteration"), epsilon),
                format_number(epsilon, 3) if private else "inf (NOT differentially private)",
                format_general(privacy.get("delta")) if private else "",
                format_number(entry.get("test_auc"), 3),
                format_number(real_auc, 3),
            ]
        )
    return Table(
        ["setting", "checkpoint (iteration)", "epsilon", "delta", "AUC: synthetic rows", "AUC: real rows"],
        rows,
        caption="Chosen checkpoint. Epsilon: the whole release's (an experiment: the checkpoint's training epsilon). "
        "AUC: logistic regression trained on its synthetic rows, or on real training rows, scored on the real "
        "test split.",
    )


def _value_text(value: object, where: object = None) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, list):
        value = len(value)
    text = format_number(value, 4)
    if where:
        text += f" ({', '.join(map(str, where)) if isinstance(where, list) else where})"
    return text


def fidelity_table(fidelity: dict[str, dict], sdmetrics: dict[str, dict | None]) -> Table:
    """Figures as rows, settings as columns; a figure with a target carries its light (class and word)."""
    settings = list(fidelity)
    verdicts = {name: fidelity_verdicts(summary) for name, summary in fidelity.items()}
    rows: list[list[str]] = []
    classes: dict[tuple[int, int], str] = {}
    for figure, label, where_key in FIDELITY_ROWS:
        target = FIDELITY_TARGETS.get(figure)
        row = [label, "" if target is None else f"<= {target:g}"]
        for j, name in enumerate(settings):
            summary = fidelity[name]
            text = _value_text(summary.get(figure), summary.get(where_key) if where_key else None)
            if figure in verdicts[name]:
                light = verdicts[name][figure]["light"]
                if light in LIGHT_WORDS:
                    text += f" - {LIGHT_WORDS[light]}"
                    classes[(len(rows), 2 + j)] = f"light-{light}"
            row.append(text)
        rows.append(row)
    for key, label in SDMETRICS_ROWS:
        row = [label, ""]
        for name in settings:
            scores = sdmetrics.get(name)
            row.append(format_number(scores.get(key), 4) if scores else "not computed")
        rows.append(row)
    header = ["fidelity against the real table", "target", *[f"setting {name}" for name in settings]]
    return Table(header, rows, cell_classes=classes)


def summary_warnings(
    fidelity: dict[str, dict], sdmetrics: dict[str, dict | None], chosen: dict[str, dict], level_warning_count: int
) -> list[str]:
    """Short warnings for the first screen: targets missed, levels lost, no SDMetrics, non-private
    settings, and how many warnings the Warnings section holds."""
    lines = []
    for name, summary in fidelity.items():
        missed = [figure for figure, v in fidelity_verdicts(summary).items() if v["verdict"] == MISSED]
        if missed:
            labels = [FIGURE_LABELS[figure] for figure in missed]
            lines.append(f"Setting {name} misses {len(missed)} fidelity target(s): {'; '.join(labels)}.")
        lost = [f"{column}={level}" for column, level in summary.get("lost_levels") or []]
        if lost:
            shown = ", ".join(lost[:MAX_LEVELS_LISTED]) + (
                f" and {len(lost) - MAX_LEVELS_LISTED} more" if len(lost) > MAX_LEVELS_LISTED else ""
            )
            lines.append(f"Setting {name} never produces {len(lost)} level(s) or cell(s) of the real table: {shown}.")
        if sdmetrics.get(name) is None:
            lines.append(f"Setting {name}: SDMetrics scores not computed (sdmetrics is not installed).")
    for name, entry in chosen.items():
        if not is_finite(entry.get("epsilon")):
            lines.append(f"Setting {name} is NOT differentially private (epsilon = inf): never publish it.")
    if level_warning_count:
        lines.append(f"{level_warning_count} warning(s) about vanished levels: see the Warnings section.")
    return lines


def summary_panel(
    *,
    statement: PrivacyStatement,
    privacy: dict,
    chosen: dict[str, dict],
    results: pd.DataFrame,
    fidelity: dict[str, dict],
    sdmetrics: dict[str, dict | None],
    level_warning_count: int,
) -> Panel:
    """The first screen. `fidelity`: {setting: `fidelity_summary` against the real table}; `sdmetrics`:
    {setting: `sdmetrics_quality` or None}; `level_warning_count`: the Warnings section's lines."""
    blocks: list[Heading | Paragraph | WarningLine | Table] = [Heading(1, SUMMARY_HEADING)]
    if chosen:
        blocks.append(_released_table(chosen, privacy, _real_auc(results)))
    else:
        blocks.append(Paragraph("No checkpoint was chosen."))
    blocks.append(Paragraph(f'What epsilon covers: {plain_coverage(statement)} Details in "{EPSILON_HEADING}" below.'))
    if fidelity:
        blocks.append(fidelity_table(fidelity, sdmetrics))
    else:
        blocks.append(Paragraph("Fidelity not measured: it needs the real table and a synthetic one."))
    lines = summary_warnings(fidelity, sdmetrics, chosen, level_warning_count)
    blocks += [WarningLine(line) for line in lines] or [Paragraph("No warning.")]
    return Panel(SUMMARY_ID, tuple(blocks))
