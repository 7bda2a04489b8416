"""The INTERNAL report: one self-contained HTML file for the data steward, never published.

It holds real-data statistics (AUCs on the real test split, real distributions, correlations,
importances, imputation counts, fidelity against the real table), so it is marked INTERNAL at its top and
bottom. It opens with the answer (`summary`: epsilon, what it covers, AUC, fidelity with traffic lights,
warnings), then the sections, the thesis' figures and tables in a section of their own.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.fidelity import fidelity_summary, sdmetrics_quality
from dpsynth.models.evaluation.quality import quality_summary, spearman_matrix, subsample
from dpsynth.models.privacy.statement import PrivacyStatement
from dpsynth.tasks.evaluate import RESULT_COLUMNS
from dpsynth.tasks.report import sections
from dpsynth.tasks.report.document import Document
from dpsynth.tasks.report.levels import level_warnings, normalise_chosen
from dpsynth.tasks.report.summary import summary_panel

INTERNAL_BANNER = (
    "INTERNAL - contains real-data statistics (AUCs measured on real data, fidelity against the real table, "
    "real distributions, correlations, importances, imputation counts). For the data steward only: never publish. "
    "The publishable document is the release notes."
)


def fidelity_figures(
    schema: DatasetSchema,
    real_frame: pd.DataFrame | None,
    synthetic_frames: dict[str, pd.DataFrame],
    max_rows: int | None,
    seed: int,
) -> dict[str, dict]:
    """The fidelity figures the report shows, per setting: `fidelity_summary` (1-way and 2-way TVD, point
    masses, lost levels, Spearman) on the whole tables, and SDMetrics' scores under "sdmetrics" (None
    without sdmetrics). Empty without the real table. Internal: every figure reads real rows."""
    if real_frame is None:
        return {}
    return {
        name: {
            **fidelity_summary(schema, real_frame, frame, spearman_rows=max_rows),
            "sdmetrics": sdmetrics_quality(schema, real_frame, frame, seed=seed),
        }
        for name, frame in synthetic_frames.items()
    }


def build_internal_report(
    path: str | Path,
    *,
    title: str,
    schema: DatasetSchema,
    results: pd.DataFrame,
    chosen: dict[str, dict],
    real_frame: pd.DataFrame | None,
    synthetic_frames: dict[str, pd.DataFrame],
    ledger_level_shares: dict[str, list[dict]],
    privacy: dict,
    statement: PrivacyStatement,
    imputation_counts: dict | None = None,
    thesis_reference: dict | None = None,
    membership: dict | None = None,
    comparison: dict | None = None,
    max_rows: int | None = 20000,
    seed: int = 0,
    figures: dict[str, dict] | None = None,
    input_repairs: dict[str, dict[str, int]] | None = None,
) -> Path:
    """Write the INTERNAL report: one self-contained HTML file (figures embedded). Returns its path.

    results: one row per selection run, columns of `dpsynth.tasks.evaluate.RESULT_COLUMNS` (optionally
    "share:<column>=<level>" columns); setting "real" is the real-vs-real baseline, a setting named
    "baseline" with non-finite epsilon the non-private GAN. chosen: {setting: {iteration, epsilon,
    test_auc}}. real_frame: the real table (decoded, schema columns) or None. synthetic_frames:
    {setting: synthetic table} (typically the chosen checkpoint's sample). ledger_level_shares:
    {setting: [{iteration, level_shares: {column: {level: share}}}]}. privacy: the privacy summary
    (`dpsynth.tasks.privacy_summary.privacy_summary`), every key shown. imputation_counts: {column: count or
    {kind: count}}. thesis_reference: {label: {auc, epsilon, ...}}. Quality statistics use at most
    `max_rows` rows per table (drawn with `seed`); the fidelity figures (`dpsynth.models.evaluation.fidelity`)
    count over the whole tables, SDMetrics reads at most its own cap of rows. figures: `fidelity_figures`
    already computed (None: computed here). input_repairs: what validation repaired in the input, per
    column (tasks/validate.py `repairs_of`).
    """
    path = Path(path)
    chosen = normalise_chosen(chosen)
    synthetic_frames = synthetic_frames or {}
    ledger_level_shares = ledger_level_shares or {}
    results = results if results is not None else pd.DataFrame(columns=RESULT_COLUMNS)
    real = subsample(real_frame, max_rows, seed) if real_frame is not None else None
    synths = {name: subsample(frame, max_rows, seed) for name, frame in synthetic_frames.items()}
    # The frames are subsampled already: the metrics take them whole.
    quality = (
        {name: quality_summary(schema, real, frame, max_rows=None, seed=seed) for name, frame in synths.items()}
        if real is not None
        else {}
    )
    real_spearman = spearman_matrix(schema, real, max_rows=None) if real is not None else None
    spearman = {name: spearman_matrix(schema, frame, max_rows=None) for name, frame in synths.items()}

    # Fidelity on the whole tables (counts over public cells: fast); SDMetrics subsamples by itself.
    if figures is None:
        figures = fidelity_figures(schema, real_frame, synthetic_frames, max_rows, seed)
    fidelity = {name: {k: v for k, v in f.items() if k != "sdmetrics"} for name, f in figures.items()}
    sdmetrics = {name: f["sdmetrics"] for name, f in figures.items()}
    level_lines = level_warnings(schema, ledger_level_shares, chosen, results, synthetic_frames)

    doc = Document()
    doc.paragraph(
        f"Dataset {schema.name} (schema version {schema.version}). Generated "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}."
    )
    doc.panel(
        summary_panel(
            statement=statement,
            privacy=privacy,
            chosen=chosen,
            results=results,
            fidelity=fidelity,
            sdmetrics=sdmetrics,
            level_warning_count=len(level_lines),
        )
    )
    sections.warnings_section(doc, level_lines)
    sections.epsilon_statement(doc, statement)
    sections.privacy_parameters(doc, privacy)
    sections.chosen_checkpoints(doc, chosen)
    if comparison:
        sections.generators_compared(doc, comparison)
    sections.fidelity_details(doc, fidelity, sdmetrics)
    sections.sample_quality(doc, quality)
    if membership:
        sections.membership_inference(doc, membership)
    sections.checkpoint_level_shares(doc, schema, ledger_level_shares, chosen)
    if input_repairs:
        sections.input_repairs(doc, input_repairs)
    if imputation_counts:
        sections.imputation(doc, imputation_counts)
    sections.thesis_heading(doc)
    sections.utility_figure(doc, results, chosen, thesis_reference)
    sections.distributions(doc, schema, real, synths)
    sections.feature_moments(doc, schema, real, synths)
    sections.correlations(doc, real_spearman, spearman, quality)
    sections.level_shares(doc, schema, real, synths)
    sections.feature_importance(doc, schema, real, seed)
    if thesis_reference:
        sections.thesis_values(doc, thesis_reference)
    sections.selection_runs(doc, results)

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc.to_html(f"{title} (INTERNAL)", INTERNAL_BANNER), encoding="utf-8")
    return path
