"""Sample-quality metrics: sanity on identical, shifted and collapsed tables; stars; importances."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.quality import (
    feature_stats,
    level_frequencies,
    quality_summary,
    real_data_importance,
    significance_stars,
    spearman_mad,
    spearman_matrix,
    subsample,
    total_variation,
    tvd_by_feature,
    wasserstein_by_feature,
)

CARDIO_YAML = Path(__file__).resolve().parents[2] / "configs" / "cardio.yaml"


@pytest.fixture(scope="module")
def schema() -> DatasetSchema:
    return DatasetSchema.from_yaml(CARDIO_YAML)


@pytest.fixture(scope="module")
def real(schema) -> pd.DataFrame:
    return make_demo_table(schema, 3000, seed=1)


@pytest.fixture(scope="module")
def other(schema) -> pd.DataFrame:
    return make_demo_table(schema, 3000, seed=2)


def test_feature_stats_match_pandas(schema, real):
    stats = feature_stats(schema, real)
    assert list(stats.index) == [c.name for c in schema.continuous]
    assert list(stats.columns) == ["mean", "std"]
    for name in stats.index:
        assert stats.loc[name, "mean"] == pytest.approx(real[name].mean())
        assert stats.loc[name, "std"] == pytest.approx(real[name].std(ddof=1))


def test_identical_tables_have_zero_distances(schema, real):
    w = wasserstein_by_feature(schema, real, real.copy())
    t = tvd_by_feature(schema, real, real.copy())
    assert list(w.index) == [c.name for c in schema.continuous]
    assert list(t.index) == [c.name for c in schema.discrete]
    assert np.allclose(w, 0.0) and np.allclose(t, 0.0)
    rho, _ = spearman_matrix(schema, real)
    assert spearman_mad(rho, rho.copy()) == 0.0
    summary = quality_summary(schema, real, real.copy())
    assert summary["mean_wasserstein"] == pytest.approx(0.0)
    assert summary["mean_tvd"] == pytest.approx(0.0)
    assert summary["spearman_mad"] == pytest.approx(0.0)


def test_shift_is_measured_in_units_of_the_public_bounds(schema, real):
    shifted = real.copy()
    low, high = schema.column("height").bounds
    shifted["height"] = shifted["height"] + 0.1 * (high - low)
    w = wasserstein_by_feature(schema, real, shifted)
    assert w["height"] == pytest.approx(0.1)  # a pure shift by a tenth of the declared range
    assert w.drop("height").abs().max() == pytest.approx(0.0)


def test_tvd_is_in_unit_interval_and_one_for_disjoint_supports(schema, real, other):
    t = tvd_by_feature(schema, real, other)
    assert ((t >= 0) & (t <= 1)).all() and (t > 0).any()
    collapsed = real.copy()
    collapsed["smoke"] = 1
    only_zero = real.copy()
    only_zero["smoke"] = 0
    assert tvd_by_feature(schema, only_zero, collapsed)["smoke"] == pytest.approx(1.0)
    assert tvd_by_feature(schema, real, collapsed)["smoke"] == pytest.approx((real["smoke"] == 0).mean())


def test_changed_tables_have_positive_distances(schema, real, other):
    summary = quality_summary(schema, real, other)
    assert summary["mean_wasserstein"] > 0 and summary["mean_tvd"] > 0 and summary["spearman_mad"] > 0
    assert set(summary["wasserstein"]) == {c.name for c in schema.continuous}
    assert set(summary["tvd"]) == {c.name for c in schema.discrete}


def test_spearman_matrix_shape_symmetry_and_codes(schema, real):
    rho, p = spearman_matrix(schema, real)
    names = schema.column_names
    assert list(rho.index) == names and list(rho.columns) == names and p.shape == rho.shape
    assert np.allclose(rho.to_numpy(), rho.to_numpy().T)
    assert np.allclose(np.diag(rho.to_numpy()), 1.0)
    assert ((p.to_numpy() >= 0) & (p.to_numpy() <= 1)).all()
    # Categoricals enter as level codes: a column equal to cholesterol's code correlates perfectly.
    codes = real["cholesterol"].map({1: 0, 2: 1, 3: 2})
    assert rho.loc["cholesterol", "age"] == pytest.approx(real[["age"]].assign(c=codes).corr("spearman").iloc[0, 1])
    # The demo target depends on age: strongly significant.
    assert p.loc["age", "cardio"] < 0.001


def test_spearman_with_a_constant_column_and_mad_counts_it_as_zero(schema, real):
    collapsed = real.copy()
    collapsed["gluc"] = 1
    rho, p = spearman_matrix(schema, collapsed)
    assert rho.loc["gluc"].isna().all() and p.loc["gluc"].isna().all()  # undefined, even on the diagonal
    assert rho.loc["age", "age"] == 1.0
    real_rho, _ = spearman_matrix(schema, real)
    assert np.isfinite(spearman_mad(real_rho, rho)) and spearman_mad(real_rho, rho) > 0


def test_spearman_mad_uses_the_off_diagonal_upper_triangle():
    names = ["a", "b", "c"]
    a = pd.DataFrame(np.eye(3), index=names, columns=names)
    b = a.copy()
    b.loc["a", "b"] = b.loc["b", "a"] = 0.3
    b.loc["c", "c"] = 0.0  # the diagonal is ignored
    assert spearman_mad(a, b) == pytest.approx(0.1)  # 0.3 over three pairs


@pytest.mark.parametrize(
    "p, stars",
    [
        (0.0, "***"),
        (0.0009, "***"),
        (0.001, "**"),
        (0.0099, "**"),
        (0.01, "*"),
        (0.049, "*"),
        (0.05, ""),
        (0.7, ""),
        (float("nan"), ""),
    ],
)
def test_significance_stars(p, stars):
    assert significance_stars(p) == stars


def test_level_frequencies_cover_declared_levels(schema, real):
    shares = level_frequencies(schema, real)
    assert set(shares) == {c.name for c in schema.discrete}
    for col in schema.discrete:
        assert list(shares[col.name]) == [str(level) for level in col.levels]
        assert sum(shares[col.name].values()) == pytest.approx(1.0)
    collapsed = real.copy()
    collapsed["gluc"] = 1
    assert level_frequencies(schema, collapsed)["gluc"] == {"1": 1.0, "2": 0.0, "3": 0.0}


def test_real_data_importance(schema, real):
    encoder = TableEncoder(schema)
    table = real_data_importance(schema, encoder, encoder.encode(real), seed=0)
    assert list(table.columns) == ["lr_coefficient", "rf_importance"]
    assert schema.target not in table.index and len(table) == encoder.width - 1
    assert table["rf_importance"].sum() == pytest.approx(1.0)
    assert table["rf_importance"].idxmax() == "age"  # the demo target's strongest feature
    again = real_data_importance(schema, encoder, encoder.encode(real), seed=0)
    pd.testing.assert_frame_equal(table, again)


def test_subsample_is_seeded_and_bounded(real):
    a, b = subsample(real, 100, seed=3), subsample(real, 100, seed=3)
    assert len(a) == 100 and a.index.equals(b.index)
    assert subsample(real, None) is real and subsample(real, 10**6) is real


def test_total_variation_by_hand():
    assert total_variation(np.array([0.5, 0.5, 0.0]), np.array([0.2, 0.5, 0.3])) == pytest.approx(0.3, abs=1e-15)
    assert total_variation(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == 1.0
    assert total_variation(np.array([0.25, 0.75]), np.array([0.25, 0.75])) == 0.0
