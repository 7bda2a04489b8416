"""Sample quality: how close a synthetic table is to the real one (thesis 6.2.2 and 7.2).

Pure pandas/numpy/scipy/scikit-learn on tables in the original schema (column names, declared
levels, decoded values). Every scale comes from the schema's public bounds and levels, never from
the rows. What these functions return about a *real* table is a real-data statistic: it belongs to
the internal report only. The same functions applied to a synthetic table alone (`feature_stats`,
`level_frequencies`, `spearman_matrix`) are post-processing of the DP generator and may be published.

- `feature_stats`: mean and standard deviation of each continuous feature (Table 7.2).
- `wasserstein_by_feature`: 1-Wasserstein distance per continuous feature on values scaled to [0, 1]
  by the public bounds (so 0.1 means "a tenth of the declared range").
- `total_variation`: the TVD of two share vectors (fidelity's 1- and 2-way TVDs use it too).
- `tvd_by_feature`: total-variation distance per binary/categorical feature over its declared levels
  (plus one bucket for values outside them), in [0, 1].
- `spearman_matrix`, `significance_stars`, `spearman_mad`: rank correlations with stars (Figure 7.3)
  and the mean absolute difference between two correlation matrices.
- `level_frequencies`: share of each declared level (Figure 7.4).
- `real_data_importance`: logistic-regression coefficients and random-forest importances on the real
  encoded table (Table 7.1).
- `quality_summary`: the distances and the Spearman MAD in one dictionary (for tracking).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression

from dpsynth.models.data.encoding import TableEncoder, level_codes
from dpsynth.models.data.schema import Column, DatasetSchema

OUTSIDE_LEVELS = "<other>"


def subsample(frame: pd.DataFrame, max_rows: int | None, seed: int = 0) -> pd.DataFrame:
    """At most `max_rows` rows drawn without replacement (the same for the same seed)."""
    if max_rows is None or len(frame) <= max_rows:
        return frame
    return frame.sample(n=int(max_rows), random_state=seed)


def feature_stats(schema: DatasetSchema, frame: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation (ddof=1) of each continuous feature; index = feature name."""
    rows = {}
    for col in schema.continuous:
        values = pd.to_numeric(frame[col.name], errors="coerce").dropna().to_numpy(dtype=np.float64)
        rows[col.name] = {
            "mean": float(values.mean()) if len(values) else np.nan,
            "std": float(values.std(ddof=1)) if len(values) > 1 else np.nan,
        }
    return pd.DataFrame.from_dict(rows, orient="index", columns=["mean", "std"])


def _scaled(col: Column, frame: pd.DataFrame) -> np.ndarray:
    low, high = col.continuous_bounds
    values = pd.to_numeric(frame[col.name], errors="coerce").dropna().to_numpy(dtype=np.float64)
    return (values - low) / (high - low)


def wasserstein_by_feature(
    schema: DatasetSchema, real: pd.DataFrame, synth: pd.DataFrame, max_rows: int | None = None, seed: int = 0
) -> pd.Series:
    """1-Wasserstein distance per continuous feature, values scaled to [0, 1] by the public bounds."""
    real, synth = subsample(real, max_rows, seed), subsample(synth, max_rows, seed)
    out = {}
    for col in schema.continuous:
        a, b = _scaled(col, real), _scaled(col, synth)
        out[col.name] = float(stats.wasserstein_distance(a, b)) if len(a) and len(b) else np.nan
    return pd.Series(out, name="wasserstein", dtype=np.float64)


def _shares(col: Column, frame: pd.DataFrame) -> np.ndarray:
    """Shares of the declared levels, then of values outside them (missing values count there too)."""
    codes = level_codes(col, frame[col.name].to_numpy())
    counts = np.bincount(np.where(codes < 0, len(col.levels), codes), minlength=len(col.levels) + 1)
    return counts / max(len(codes), 1)


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """Total-variation distance of two share vectors over the same cells, 0.5 * sum |p - q| (in [0, 1]):
    the one implementation behind every TVD here and in `dpsynth.models.evaluation.fidelity`."""
    return float(0.5 * np.abs(p - q).sum())


def tvd_by_feature(
    schema: DatasetSchema, real: pd.DataFrame, synth: pd.DataFrame, max_rows: int | None = None, seed: int = 0
) -> pd.Series:
    """Total-variation distance, 0.5 * sum |p - q|, per binary/categorical feature (in [0, 1])."""
    real, synth = subsample(real, max_rows, seed), subsample(synth, max_rows, seed)
    out = {col.name: total_variation(_shares(col, real), _shares(col, synth)) for col in schema.discrete}
    return pd.Series(out, name="tvd", dtype=np.float64)


def level_frequencies(schema: DatasetSchema, frame: pd.DataFrame) -> dict[str, dict[str, float]]:
    """{column: {level (as text): share}} over the declared levels of each binary/categorical column.

    The same shape as `TableEncoder.level_shares` and the ledger's per-checkpoint `level_shares`.
    Values outside the declared levels (none in a decoded table) appear under "<other>" when present.
    """
    out = {}
    for col in schema.discrete:
        shares = _shares(col, frame)
        entry = {str(level): float(share) for level, share in zip(col.levels, shares[:-1], strict=False)}
        if shares[-1] > 0:
            entry[OUTSIDE_LEVELS] = float(shares[-1])
        out[col.name] = entry
    return out


def numeric_frame(schema: DatasetSchema, frame: pd.DataFrame) -> pd.DataFrame:
    """Every schema column as numbers: continuous values as they are, discrete ones as level codes
    (index in the declared levels; values outside the levels become missing)."""
    data = {}
    for col in schema.columns:
        if col.is_continuous:
            data[col.name] = pd.to_numeric(frame[col.name], errors="coerce").to_numpy(dtype=np.float64)
        else:
            codes = level_codes(col, frame[col.name].to_numpy()).astype(np.float64)
            codes[codes < 0] = np.nan
            data[col.name] = codes
    return pd.DataFrame(data, index=frame.index)


def spearman_matrix(
    schema: DatasetSchema, frame: pd.DataFrame, max_rows: int | None = 20000, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Spearman rank correlations and their two-sided p-values over all schema columns.

    Rows with a missing value are dropped. A constant column (e.g. a level that vanished in a
    synthetic table) has no rank correlation: its entries are NaN (p-value NaN).
    """
    names = schema.column_names
    data = numeric_frame(schema, subsample(frame, max_rows, seed)).dropna().to_numpy()
    rho = np.full((len(names), len(names)), np.nan)
    pval = np.full((len(names), len(names)), np.nan)
    if len(data) >= 3:
        varying = np.flatnonzero(np.nanstd(data, axis=0) > 0)
        if len(varying) >= 2:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = stats.spearmanr(data[:, varying], axis=0)
            r = np.atleast_2d(result.statistic)
            p = np.atleast_2d(result.pvalue)
            if r.shape == (1, 1):  # two columns: scipy returns scalars
                r = np.array([[1.0, r[0, 0]], [r[0, 0], 1.0]])
                p = np.array([[0.0, p[0, 0]], [p[0, 0], 0.0]])
            rho[np.ix_(varying, varying)] = r
            pval[np.ix_(varying, varying)] = p
        for i in varying:
            rho[i, i], pval[i, i] = 1.0, 0.0
    return (pd.DataFrame(rho, index=names, columns=names), pd.DataFrame(pval, index=names, columns=names))


def significance_stars(p: float) -> str:
    """'***' for p < 0.001, '**' for p < 0.01, '*' for p < 0.05, '' otherwise (and for NaN)."""
    if p is None or not np.isfinite(p):
        return ""
    if p < 0.001:
        return "***"
    if p < 0.01:
        return "**"
    if p < 0.05:
        return "*"
    return ""


def spearman_mad(real_rho: pd.DataFrame, synth_rho: pd.DataFrame) -> float:
    """Mean absolute difference of two correlation matrices over the off-diagonal upper triangle.

    The matrices are aligned on the first one's labels. An undefined correlation (NaN: a constant
    column) counts as 0, so a generator that collapses a column is not rewarded by dropping it.
    """
    synth_rho = synth_rho.reindex(index=real_rho.index, columns=real_rho.columns)
    a = np.nan_to_num(real_rho.to_numpy(dtype=np.float64), nan=0.0)
    b = np.nan_to_num(synth_rho.to_numpy(dtype=np.float64), nan=0.0)
    upper = np.triu_indices(len(a), k=1)
    if len(upper[0]) == 0:
        return 0.0
    return float(np.abs(a[upper] - b[upper]).mean())


def real_data_importance(
    schema: DatasetSchema, encoder: TableEncoder, real_encoded: np.ndarray, seed: int = 0, max_rows: int | None = None
) -> pd.DataFrame:
    """Table 7.1: LR coefficients and RF importances of each encoded feature (target excluded).

    Both models are fitted on the [-1, 1] encoded real rows: logistic regression with scikit-learn's
    defaults (l2, C = 1), random forest with 50 trees of depth at most 5. Index: encoded feature names.
    """
    matrix = np.asarray(real_encoded, dtype=np.float64)
    if max_rows is not None and len(matrix) > max_rows:
        rows = np.random.default_rng(seed).choice(len(matrix), size=int(max_rows), replace=False)
        matrix = matrix[np.sort(rows)]
    X = matrix[:, encoder.feature_indices]
    y = (matrix[:, encoder.target_index] > 0).astype(np.int64)
    names = [encoder.encoded_names()[i] for i in encoder.feature_indices]
    if len(np.unique(y)) < 2:
        raise ValueError("the real table holds a single target class: no importance can be fitted")
    lr = LogisticRegression(max_iter=2000).fit(X, y)
    rf = RandomForestClassifier(n_estimators=50, max_depth=5, random_state=seed, n_jobs=1).fit(X, y)
    return pd.DataFrame({"lr_coefficient": lr.coef_[0], "rf_importance": rf.feature_importances_}, index=names)


def quality_summary(
    schema: DatasetSchema, real: pd.DataFrame, synth: pd.DataFrame, max_rows: int | None = 20000, seed: int = 0
) -> dict:
    """Per-feature distances and the Spearman MAD of a synthetic table against the real one.

    {"wasserstein": {feature: d}, "tvd": {feature: d}, "mean_wasserstein", "mean_tvd", "spearman_mad"}.
    Internal: every number here depends on the real rows.
    """
    real, synth = subsample(real, max_rows, seed), subsample(synth, max_rows, seed)
    wasserstein = wasserstein_by_feature(schema, real, synth)
    tvd = tvd_by_feature(schema, real, synth)
    real_rho, _ = spearman_matrix(schema, real, max_rows=None)
    synth_rho, _ = spearman_matrix(schema, synth, max_rows=None)
    return {
        "wasserstein": {k: float(v) for k, v in wasserstein.items()},
        "tvd": {k: float(v) for k, v in tvd.items()},
        "mean_wasserstein": float(wasserstein.mean()) if len(wasserstein) else float("nan"),
        "mean_tvd": float(tvd.mean()) if len(tvd) else float("nan"),
        "spearman_mad": spearman_mad(real_rho, synth_rho),
    }


__all__ = [
    "feature_stats",
    "level_frequencies",
    "numeric_frame",
    "quality_summary",
    "real_data_importance",
    "significance_stars",
    "spearman_mad",
    "spearman_matrix",
    "subsample",
    "total_variation",
    "tvd_by_feature",
    "wasserstein_by_feature",
]
