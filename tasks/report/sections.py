"""The sections of the two documents, each a function that appends its blocks to a `Document`.

Sections only lay out numbers: every sample-quality metric comes from `dpsynth.models.evaluation.quality`
(computed by the caller or here through its functions), every AUC from the selection results.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpsynth.models.data.encoding import TableEncoder, level_codes
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.quality import feature_stats, level_frequencies, real_data_importance
from dpsynth.models.privacy.statement import HEADING as EPSILON_HEADING
from dpsynth.models.privacy.statement import PrivacyStatement
from dpsynth.tasks.evaluate import RESULT_COLUMNS
from dpsynth.tasks.report import figures
from dpsynth.tasks.report.document import Document, Table
from dpsynth.tasks.report.figures import REAL_SETTING
from dpsynth.tasks.report.formatting import format_number, frame_table, iteration_label, mapping_table
from dpsynth.tasks.report.levels import chosen_iteration, level_share_table


def epsilon_statement(doc: Document, statement: PrivacyStatement) -> None:
    """What epsilon covers and what it does not: the same text in both documents."""
    doc.heading(1, EPSILON_HEADING)
    doc.paragraph(statement.covers)
    doc.paragraph("Epsilon does NOT cover:")
    doc.bullets(list(statement.does_not_cover) or ["nothing else."])
    doc.paragraph(statement.internal_only)


# ---- the internal report -----------------------------------------------------------------------------------


def warnings_section(doc: Document, lines: list[str]) -> None:
    """`lines`: the level warnings (`dpsynth.tasks.report.levels.level_warnings`)."""
    doc.heading(1, "Warnings")
    if lines:
        for line in lines:
            doc.warning(line)
    else:
        doc.paragraph("No level of a binary or categorical column vanished at any recorded checkpoint.")


def privacy_parameters(doc: Document, privacy: dict) -> None:
    """Every key of the privacy summary under its own name (internal: nothing is filtered out); the
    labels the release notes show them under are no parameter."""
    doc.heading(1, "Privacy parameters")
    doc.table(mapping_table({k: v for k, v in privacy.items() if not isinstance(v, dict)}, "parameter"))
    for key, value in privacy.items():
        if isinstance(value, dict) and value and key != "labels":
            doc.paragraph(f"{key}:")
            doc.table(mapping_table(value, key.rstrip("s") or key))


def chosen_checkpoints(doc: Document, chosen: dict) -> None:
    doc.heading(1, "Chosen checkpoints")
    doc.paragraph(
        "A release: the checkpoint its differentially private choice drew, at the whole release's "
        "epsilon. An experiment: per setting, the lowest-epsilon checkpoint whose AUC is close to the "
        "setting's best (thesis Figure 7.1), at that checkpoint's training epsilon. The test AUC is "
        "measured on real test rows: internal only."
    )
    if chosen:
        frame = pd.DataFrame.from_dict(chosen, orient="index")
        frame = frame[
            [c for c in ("iteration", "epsilon", "test_auc") if c in frame.columns]
            + [c for c in frame.columns if c not in ("iteration", "epsilon", "test_auc")]
        ]
        table = frame_table(frame.astype(object), {"epsilon": 3}, index_name="setting")
        if "iteration" in frame.columns:
            for row, (_, entry) in zip(table.rows, frame.iterrows(), strict=True):
                row[1] = iteration_label(entry["iteration"], entry.get("epsilon"))
        doc.table(table)
    else:
        doc.paragraph("No checkpoint was chosen.")


def generators_compared(doc: Document, comparison: dict) -> None:
    doc.heading(1, "Generators compared")
    doc.paragraph(
        "Each setting's chosen checkpoint, with what publishing it costs (epsilon), its AUC on real "
        "test rows, and its sample quality against the real training rows: Spearman mean absolute "
        "difference over feature pairs, mean total-variation distance over discrete features, mean "
        "Wasserstein distance over continuous features scaled to [0, 1] by their public bounds."
    )
    doc.table(
        frame_table(
            pd.DataFrame.from_dict(comparison, orient="index").astype(object),
            {"epsilon": 3, "test_auc": 4, "spearman_mad": 4, "mean_tvd": 4, "mean_wasserstein": 4},
            index_name="setting",
        )
    )


def thesis_heading(doc: Document) -> None:
    """The section that reproduces the thesis' figures and tables (its subsections follow)."""
    doc.heading(1, "Thesis reproduction: Figures 7.1 to 7.4, Tables 7.1 and 7.2")
    doc.paragraph(
        "The thesis' figures and tables, drawn for this run. The summary at the top holds the answer; these "
        "show where it comes from."
    )


def utility_figure(doc: Document, results: pd.DataFrame, chosen: dict, thesis_reference: dict | None) -> None:
    doc.heading(2, "Figure 7.1: utility against privacy")
    if not results.empty and results["test_auc"].notna().any():
        drawn = figures.auc_figure(results, chosen, thesis_reference)
        doc.image(drawn.png, drawn.caption)
    else:
        doc.paragraph("No AUC recorded.")


def fidelity_details(doc: Document, fidelity: dict[str, dict], sdmetrics: dict[str, dict | None]) -> None:
    """The figures behind the summary's fidelity table: `fidelity` {setting: `fidelity_summary`},
    `sdmetrics` {setting: `sdmetrics_quality` or None}."""
    doc.heading(1, "Fidelity against the real table")
    if not fidelity:
        doc.paragraph("Needs the real table and at least one synthetic table.")
        return
    first = next(iter(fidelity.values()))
    doc.paragraph(
        f"Total-variation distance (TVD, 0.5 x the sum of |real share - synthetic share|) over public cells: the "
        f"declared levels of a binary or categorical column; {first['bins']} equal bins of a continuous column's "
        f"public bounds plus one cell per declared point mass; one cell for missing values. 2-way TVD: over the "
        f"joint cells of a pair of columns ({first['pairs_scored']} of {first['pairs_total']} pairs scored). A "
        f"level is lost when it holds at least {first['lost_level_floor']:.0%} of the real rows and no synthetic "
        f"row. Spearman MAD: mean absolute gap of the rank correlations between continuous columns. SDMetrics: "
        f"its single-table QualityReport (Column Shapes, Column Pair Trends, overall: their mean; 1 is best)."
    )
    doc.paragraph(
        f"Numeric shapes, which bins of the public bounds cannot see (a spike spread over the bin that holds it): "
        f"TVD on {first['quantile_cells']} cells cut at the real table's quantiles, a value that holds at least "
        f"one such cell's share of the real rows (a heap) or a declared point mass a cell of its own; 2-way TVD "
        f"over the same pairs with numeric columns on those cells; the Kolmogorov-Smirnov distance (the largest "
        f"gap between the two cumulative shares; SDMetrics' KSComplement is 1 minus it)."
    )
    per_column = pd.DataFrame({name: pd.Series(f["column_tvd"], dtype=np.float64) for name, f in fidelity.items()})
    doc.table(frame_table(per_column, 4, index_name="column", caption="TVD per column (1-way)"))
    shapes = {
        f"{name}: {figure}": pd.Series(f[key], dtype=np.float64)
        for name, f in fidelity.items()
        for figure, key in (("quantile-cell TVD", "continuous_quantile_tvd"), ("KS", "continuous_ks"))
    }
    if any(len(series) for series in shapes.values()):
        doc.table(
            frame_table(
                pd.DataFrame(shapes),
                4,
                index_name="numeric column",
                caption="Per numeric column: TVD on cells at the real quantiles, and KS distance",
            )
        )
    gaps = pd.DataFrame({name: pd.Series(f["point_mass_gaps"], dtype=np.float64) for name, f in fidelity.items()})
    if not gaps.empty:
        doc.table(
            frame_table(gaps, 4, index_name="point mass", caption="|real share - synthetic share| at each point mass")
        )
    for name, f in fidelity.items():
        lost = ", ".join(f"{column}={level}" for column, level in f["lost_levels"]) or "none"
        pair = " and ".join(f["pairwise_tvd_worst_pair"] or []) or "none"
        quantile_pair = " and ".join(f["pairwise_quantile_tvd_worst_pair"] or []) or "none"
        own = "; ".join(
            f"{column} {', '.join(f'{v:g}' for v in values)}"
            for column, values in f["quantile_heaps"].items()
            if values
        )
        doc.paragraph(
            f"Setting {name}: levels lost: {lost}. Worst pair (2-way TVD): {pair}; on real-quantile cells: "
            f"{quantile_pair}. Values with a cell of their own: {own or 'none'}."
        )
    rows = {
        name: {
            "Column Shapes": s["column_shapes"],
            "Column Pair Trends": s["column_pair_trends"],
            "overall": s["overall"],
            "real rows scored": s["rows_scored"][0],
            "synthetic rows scored": s["rows_scored"][1],
        }
        for name, s in sdmetrics.items()
        if s is not None
    }
    if rows:
        doc.table(
            frame_table(
                pd.DataFrame.from_dict(rows, orient="index").astype(object),
                4,
                index_name="setting",
                caption="SDMetrics QualityReport (1 is best)",
            )
        )
    else:
        doc.paragraph("SDMetrics scores not computed: sdmetrics is not installed.")


def sample_quality(doc: Document, quality: dict[str, dict]) -> None:
    """`quality`: {setting: `quality_summary` of its synthetic table against the real one}."""
    doc.heading(1, "Sample quality against the real table")
    if not quality:
        doc.paragraph("Needs the real table and at least one synthetic table.")
        return
    summary = {
        name: {
            "mean Wasserstein (bounds-scaled)": q["mean_wasserstein"],
            "mean TVD": q["mean_tvd"],
            "Spearman MAD": q["spearman_mad"],
        }
        for name, q in quality.items()
    }
    doc.table(frame_table(pd.DataFrame.from_dict(summary, orient="index"), 4, index_name="setting"))
    per_feature = {
        key: pd.DataFrame({name: pd.Series(q[key], dtype=np.float64) for name, q in quality.items()}).T
        for key in ("wasserstein", "tvd")
    }
    doc.table(
        frame_table(
            per_feature["wasserstein"],
            4,
            index_name="setting",
            caption="Wasserstein distance per continuous feature (values scaled to [0, 1] by the public bounds)",
        )
    )
    doc.table(
        frame_table(
            per_feature["tvd"],
            4,
            index_name="setting",
            caption="Total-variation distance per binary/categorical feature",
        )
    )


def distributions(doc: Document, schema: DatasetSchema, real: pd.DataFrame | None, synths: dict) -> None:
    doc.heading(2, "Figure 7.2: continuous-feature distributions")
    for name, frame in synths.items():
        shown = f"real (gray, filled) vs synthetic {name} (blue line)" if real is not None else f"synthetic {name}"
        doc.image(
            figures.histogram_figure(schema, real, frame, name),
            f"Histograms (densities) over the public bounds, 40 bins: {shown}.",
        )


def feature_moments(doc: Document, schema: DatasetSchema, real: pd.DataFrame | None, synths: dict) -> None:
    doc.heading(2, "Table 7.2: mean and standard deviation of continuous features")
    columns = {}
    if real is not None:
        s = feature_stats(schema, real)
        columns["real mean"], columns["real std"] = s["mean"], s["std"]
    for name, frame in synths.items():
        s = feature_stats(schema, frame)
        columns[f"{name} mean"], columns[f"{name} std"] = s["mean"], s["std"]
    if columns:
        doc.table(frame_table(pd.DataFrame(columns), 3, index_name="feature"))


def correlations(
    doc: Document,
    real_spearman: tuple[pd.DataFrame, pd.DataFrame] | None,
    spearman: dict[str, tuple[pd.DataFrame, pd.DataFrame]],
    quality: dict[str, dict],
) -> None:
    """Heatmaps of the Spearman matrices ((rho, p-values) pairs); the MAD from real is `quality`'s."""
    doc.heading(2, "Figure 7.3: Spearman rank correlations")
    doc.paragraph(
        "Categorical columns enter as their level codes. Stars: *** p < 0.001, ** p < 0.01, "
        "* p < 0.05. MAD: mean absolute difference from the real matrix over the off-diagonal "
        "upper triangle."
    )
    if real_spearman is not None:
        rho_real, pval_real = real_spearman
        doc.image(figures.heatmap_figure(rho_real, pval_real, "real"), "Spearman correlations of the real table.")
    for name, (rho, pval) in spearman.items():
        mad = f" (MAD from real {quality[name]['spearman_mad']:.4f})" if name in quality else ""
        doc.image(figures.heatmap_figure(rho, pval, f"{name}{mad}"), f"Spearman correlations of synthetic {name}{mad}.")


def level_shares(doc: Document, schema: DatasetSchema, real: pd.DataFrame | None, synths: dict) -> None:
    doc.heading(2, "Figure 7.4: level shares of binary and categorical features")
    shares = {}
    if real is not None:
        shares[REAL_SETTING] = level_frequencies(schema, real)
    for name, frame in synths.items():
        shares[name] = level_frequencies(schema, frame)
    if shares:
        shown = "real (gray) and each synthetic table" if real is not None else "each synthetic table"
        doc.image(figures.frequency_figure(schema, shares), f"Share of each declared level: {shown}.")
        rows = {
            f"{col}={level}": {name: s.get(col, {}).get(level) for name, s in shares.items()}
            for col in (c.name for c in schema.discrete)
            for level in dict.fromkeys(lvl for s in shares.values() for lvl in s.get(col, {}))
        }
        doc.table(frame_table(pd.DataFrame.from_dict(rows, orient="index").astype(object), 4, index_name="level"))


def _complete_rows(schema: DatasetSchema, frame: pd.DataFrame) -> pd.DataFrame:
    """Rows with every schema value present and valid (what the encoder accepts)."""
    keep = np.ones(len(frame), dtype=bool)
    for col in schema.columns:
        if col.is_continuous:
            keep &= pd.to_numeric(frame[col.name], errors="coerce").notna().to_numpy()
        else:
            keep &= level_codes(col, frame[col.name].to_numpy()) >= 0
    return frame.loc[keep, schema.column_names]


def feature_importance(doc: Document, schema: DatasetSchema, real: pd.DataFrame | None, seed: int) -> None:
    doc.heading(2, "Table 7.1: feature importance on the real data")
    if real is None:
        doc.paragraph("No real table given.")
        return
    complete = _complete_rows(schema, real)
    try:
        encoder = TableEncoder(schema)
        importance = real_data_importance(schema, encoder, encoder.encode(complete), seed)
        doc.paragraph(
            f"Logistic regression (l2, C = 1) coefficients on the [-1, 1] encoded features and "
            f"random-forest importances (50 trees, depth 5), fitted on {len(complete)} real rows."
        )
        doc.table(frame_table(importance, 4, index_name="feature"))
    except ValueError as exc:
        doc.paragraph(f"Not computed: {exc}.")


def checkpoint_level_shares(doc: Document, schema: DatasetSchema, ledger_level_shares: dict, chosen: dict) -> None:
    doc.heading(1, "Level shares at every checkpoint")
    doc.paragraph(
        "Shares of generated samples recorded in each setting's ledger. Highlighted: a level that vanished (share 0)."
    )
    for setting, entries in ledger_level_shares.items():
        entries = [e for e in entries or [] if e.get("level_shares")]
        if entries:
            doc.heading(2, f"Setting {setting}")
            doc.table(level_share_table(schema, entries, chosen_iteration(chosen, setting)))


def input_repairs(doc: Document, repairs: dict[str, dict[str, int]]) -> None:
    doc.heading(1, "What the release did to the input (counts: internal)")
    doc.paragraph(
        "Per column, the values of the whole input table that validation found outside the column's public "
        "bounds or missing: each is imputed as a missing value is, never clipped. A value outside a "
        "discrete column's levels is not repaired: validation refuses the table."
    )
    rows = [[column, str(r["outside_bounds"]), str(r["missing"]), str(r["imputed"])] for column, r in repairs.items()]
    doc.table(Table(["column", "outside the public bounds", "missing", "imputed"], rows))


def imputation(doc: Document, counts: dict) -> None:
    doc.heading(1, "KNN imputation (counts: internal)")
    doc.table(mapping_table(counts, "column", "values imputed"))


def membership_inference(doc: Document, membership: dict) -> None:
    doc.heading(1, "Membership inference against the chosen checkpoints")
    doc.paragraph(
        "Members: the generator's training rows; non-members: the real test rows, which nothing "
        "published depends on; equally many of each. DCR: the share of synthetic rows whose nearest "
        "real row is a member (1/2: no preference for training rows). Attacks: the AUC of telling "
        "members from non-members from the synthetic table alone, by the distance to the nearest "
        "synthetic row, and by the synthetic over the reference (validation rows) density "
        "(DOMIAS-style); 0.5 is chance. Intervals: 95%."
    )
    rows = []
    for setting, m in membership.items():
        dcr, near, ratio = m["dcr"], m["nearest_synthetic_auc"], m["density_ratio_auc"]
        rows.append(
            [
                str(setting),
                format_number(m["rows_each"]),
                f"{dcr['share_closer_to_members']:.3f} [{dcr['low']:.3f}, {dcr['high']:.3f}]",
                f"{near['auc']:.3f} [{near['low']:.3f}, {near['high']:.3f}]",
                f"{ratio['auc']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]",
            ]
        )
    doc.table(
        Table(
            ["setting", "rows of each", "DCR member share", "nearest-synthetic attack AUC", "density-ratio attack AUC"],
            rows,
        )
    )


def thesis_values(doc: Document, thesis_reference: dict) -> None:
    doc.heading(2, "Published reference values")
    doc.paragraph(
        "Results published on this table (the thesis and other tools); those with an epsilon are the "
        "numbered crosses of Figure 7.1."
    )
    doc.table(mapping_table(thesis_reference, "system"))


def _sort_results(results: pd.DataFrame) -> pd.DataFrame:
    columns = [c for c in RESULT_COLUMNS if c in results.columns]
    columns += [c for c in results.columns if c not in columns]
    order = [c for c in ("setting", "iteration", "index") if c in results.columns]
    return results[columns].sort_values(order, kind="stable") if order else results[columns]


def selection_runs(doc: Document, results: pd.DataFrame) -> None:
    doc.heading(1, "Model selection: every run")
    if not results.empty:
        ordered = _sort_results(results)
        table = frame_table(ordered.astype(object), {"epsilon": 3, "C": 6, "seconds": 2}, index=False)
        if "iteration" in ordered.columns:  # the untrained checkpoint of a generator says so (not the real runs)
            at = list(ordered.columns).index("iteration")
            for row, (_, entry) in zip(table.rows, ordered.iterrows(), strict=True):
                if entry.get("setting") != REAL_SETTING:
                    row[at] = iteration_label(entry["iteration"], entry.get("epsilon"))
        doc.table(table)
    else:
        doc.paragraph("No selection run recorded.")
