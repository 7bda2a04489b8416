"""The published release notes: only content covered by the DP guarantee or public by construction.

Statistics of the released synthetic table, the privacy parameters (under the labels the privacy
summary gives them), the settings, the epsilon ledger, the public schema, and the statement of what
epsilon covers. No AUC (even the released checkpoint's AUC is measured on real test rows), no
real-data statistic, no fidelity figure against the real table (a sentence says it is internal), no
imputation count, no discriminator loss, no validation detail.

A release's notes are rendered from its `PublicRelease` (`write_public_release_notes`); an experiment's,
per setting, from its privacy summary and chosen checkpoint (`build_release_notes`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.quality import feature_stats, level_frequencies
from dpsynth.models.privacy.statement import PrivacyStatement
from dpsynth.tasks.report.document import Document, Table
from dpsynth.tasks.report.formatting import (
    format_general,
    format_number,
    frame_table,
    is_finite,
    iteration_label,
    mapping_table,
)
from dpsynth.tasks.report.levels import normalise_chosen
from dpsynth.tasks.report.sections import epsilon_statement

if TYPE_CHECKING:
    from dpsynth.tasks.public_release import PublicRelease

# Keys of a setting's description that the notes show (its generator, K, whether private, its budget).
PUBLIC_SETTING_KEYS = (
    "generator",
    "discriminators",
    "K",
    "gamma",
    "private",
    "iterations",
    "last_iteration",
    "epsilon_budget",
)


# Fidelity against the real table (TVDs, lost levels, SDMetrics' scores) is computed from real rows, which
# epsilon does not cover: the notes say where it is instead of showing it.
FIDELITY_NOT_PUBLISHED = (
    "Fidelity to the real table (total-variation distances, lost levels, SDMetrics quality scores) is computed "
    "from the real rows, which this release's epsilon does not cover, so it is not published: it is in the "
    "internal report only. The statistics above describe the synthetic rows alone."
)


def public_parameters(privacy: dict) -> dict:
    """{label: value} for each scalar of the privacy summary that `privacy["labels"]` names: the
    parameters the notes publish (anything unlabelled stays in the internal report)."""
    labels = privacy["labels"]
    return {labels[k]: v for k, v in privacy.items() if k in labels and not isinstance(v, dict)}


def release_notes_document(
    schema: DatasetSchema,
    synthetic_frame: pd.DataFrame,
    privacy: dict,
    chosen: dict,
    ledger: list[dict],
    statement: PrivacyStatement,
) -> Document:
    doc = Document()
    doc.paragraph(
        "Published release notes. Every number below is either public configuration, the output of "
        "the privacy accountant, or a statistic of the released synthetic table (post-processing of "
        "the differentially private generator). No real row and no statistic of the real table is "
        "included."
    )

    doc.heading(1, "Privacy guarantee")
    picks = normalise_chosen(chosen)
    for setting, entry in picks.items():
        eps = entry.get("epsilon")
        eps_text = format_number(float(eps), 3) if eps is not None else ""
        private = is_finite(eps)
        doc.paragraph(
            f"Setting {setting}, checkpoint at iteration {entry.get('iteration')}: "
            + (
                f"(epsilon, delta) = ({eps_text}, {format_general(privacy.get('delta'))})-differential "
                f"privacy for the whole release, unit of privacy one row."
                if private
                else "NOT differentially private (non-private setting, epsilon = inf)."
            )
        )
    public = public_parameters(privacy)
    if public:
        doc.table(mapping_table(public, "parameter"))
    settings = privacy.get("settings")
    if isinstance(settings, dict) and settings:
        doc.paragraph("Settings (for GS-WGAN, gamma = 1/K: each generated row queries one of K discriminators):")
        doc.table(
            mapping_table(
                {
                    name: {k: v for k, v in (spec or {}).items() if k in PUBLIC_SETTING_KEYS}
                    for name, spec in settings.items()
                },
                "setting",
            )
        )

    doc.heading(1, "Released checkpoint")
    doc.table(
        Table(
            ["setting", "iteration", "epsilon"],
            [
                [str(s), iteration_label(e.get("iteration"), e.get("epsilon")), format_number(e.get("epsilon"), 3)]
                for s, e in picks.items()
            ],
        )
    )

    doc.heading(1, "Epsilon ledger")
    doc.paragraph(
        "Epsilon spent by training up to each checkpoint (the accountant's output). Every checkpoint up "
        "to the last was trained and considered, so the release costs at least the last one's, combined "
        "with the choice as stated above."
    )
    doc.table(
        Table(
            ["iteration", "epsilon"],
            [
                [iteration_label(entry.get("iteration"), entry.get("epsilon")), format_number(entry.get("epsilon"), 3)]
                for entry in sorted(ledger or [], key=lambda e: e.get("iteration", 0))
            ],
        )
    )

    epsilon_statement(doc, statement)

    doc.heading(1, "The synthetic table")
    doc.paragraph(
        f"{len(synthetic_frame)} synthetic rows, {len(schema.columns)} columns, sampled from the released "
        f"generator. Statistics below are of this synthetic table only."
    )
    doc.table(
        frame_table(
            feature_stats(schema, synthetic_frame),
            3,
            index_name="continuous feature",
            caption="Mean and standard deviation (synthetic)",
        )
    )
    rows = [
        [col, level, format_number(share, 4)]
        for col, levels in level_frequencies(schema, synthetic_frame).items()
        for level, share in levels.items()
    ]
    doc.table(Table(["column", "level", "share (synthetic)"], rows))
    doc.paragraph(FIDELITY_NOT_PUBLISHED)

    doc.heading(1, "Schema (public)")
    doc.table(
        Table(
            ["column", "type", "bounds or levels", "unit"],
            [
                [
                    c.name,
                    c.kind + (" (target)" if c.name == schema.target else ""),
                    (
                        f"[{format_general(c.continuous_bounds[0])}, {format_general(c.continuous_bounds[1])}]"
                        if c.is_continuous
                        else ", ".join(map(str, c.levels))
                    ),
                    c.unit,
                ]
                for c in schema.columns
            ],
        )
    )
    return doc


def _write(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def build_release_notes(
    path: str | Path,
    *,
    title: str,
    schema: DatasetSchema,
    synthetic_frame: pd.DataFrame,
    privacy: dict,
    chosen: dict,
    ledger: list[dict],
    statement: PrivacyStatement,
) -> Path:
    """Write the published release notes as Markdown. DP-covered and public content only.

    From `chosen` only each setting's iteration and epsilon are used (never its AUC); from `ledger`
    only iteration and epsilon; from `privacy` (a privacy summary) only the scalars its "labels" name
    and the settings' PUBLIC_SETTING_KEYS.
    """
    doc = release_notes_document(schema, synthetic_frame, privacy, chosen, ledger, statement)
    return _write(path, doc.to_markdown(title))


def build_release_notes_html(
    path: str | Path,
    *,
    title: str,
    schema: DatasetSchema,
    synthetic_frame: pd.DataFrame,
    privacy: dict,
    chosen: dict,
    ledger: list[dict],
    statement: PrivacyStatement,
) -> Path:
    """The same release notes as one HTML file."""
    doc = release_notes_document(schema, synthetic_frame, privacy, chosen, ledger, statement)
    return _write(path, doc.to_html(title))


def write_public_release_notes(
    path: str | Path, release: PublicRelease, *, title: str, schema: DatasetSchema, synthetic_frame: pd.DataFrame
) -> Path:
    """A release's notes (RELEASE_NOTES.md of its bundle), rendered from its public record: the released
    checkpoint at the whole release's epsilon, the training ledger, the record's privacy summary and
    statement, and the statistics of `synthetic_frame` (the published rows)."""
    return build_release_notes(
        path,
        title=title,
        schema=schema,
        synthetic_frame=synthetic_frame,
        privacy=release.privacy,
        chosen={release.setting: {"iteration": release.iteration, "epsilon": release.epsilon}},
        ledger=[{"iteration": c.iteration, "epsilon": c.epsilon} for c in release.checkpoints],
        statement=release.statement,
    )
