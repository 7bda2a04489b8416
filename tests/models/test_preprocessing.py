import numpy as np
import pandas as pd

from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.preprocessing import (
    UnitScaledImputer,
    invalid_to_missing,
    row_local_split,
    row_local_subsample,
    stratified_split,
    typed_frame,
)
from dpsynth.models.privacy.secret import PrivacySecret


def test_split_is_stratified_sized_and_deterministic():
    y = np.array([0] * 700 + [1] * 300)
    a = stratified_split(y, (0.8, 0.1, 0.1), seed=5)
    b = stratified_split(y, (0.8, 0.1, 0.1), seed=5)
    c = stratified_split(y, (0.8, 0.1, 0.1), seed=6)
    assert [len(a[k]) for k in ("train", "val", "test")] == [800, 100, 100]
    for part in a.values():
        assert abs(y[part].mean() - 0.3) < 0.011
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["test"], c["test"])
    assert len(np.unique(np.concatenate(list(a.values())))) == 1000


def test_row_local_split_depends_on_index_and_secret_only(test_secret):
    parts = row_local_split(20_000, (0.8, 0.1, 0.1), test_secret)
    sizes = {k: len(v) for k, v in parts.items()}
    # Binomial sizes around the fractions (4 standard deviations), disjoint and complete.
    assert abs(sizes["train"] - 16_000) < 4 * (20_000 * 0.16) ** 0.5
    assert abs(sizes["val"] - 2_000) < 4 * (20_000 * 0.09) ** 0.5
    assert np.array_equal(np.sort(np.concatenate(list(parts.values()))), np.arange(20_000))
    # The same secret gives the same split; another secret another one.
    again = row_local_split(20_000, (0.8, 0.1, 0.1), test_secret)
    other = row_local_split(20_000, (0.8, 0.1, 0.1), PrivacySecret.from_hex("07" * 32))
    assert all(np.array_equal(parts[k], again[k]) for k in parts)
    assert not np.array_equal(parts["test"], other["test"])
    # A subsample keeps each kept row's split: restricting the rows moves nobody.
    keep = row_local_subsample(20_000, 3_000, test_secret)
    assert len(keep) == 3_000 and np.array_equal(keep, np.sort(keep))
    sub = row_local_split(20_000, (0.8, 0.1, 0.1), test_secret, keep)
    for k in parts:
        assert np.array_equal(sub[k], np.intersect1d(parts[k], keep))
    assert np.array_equal(row_local_subsample(500, 900, test_secret), np.arange(500))


def test_group_imputation_takes_donors_from_the_group_only(cardio_schema, demo_frame):
    table = demo_frame[cardio_schema.column_names].iloc[:60].reset_index(drop=True)
    table.loc[[3, 40], "weight"] = np.nan
    table.loc[[41, 42, 43, 44, 45], "height"] = 5  # every height of group 2 invalid
    numeric, _ = invalid_to_missing(cardio_schema, table)
    groups = [np.arange(0, 30), np.arange(30, 41), np.arange(41, 46)]
    imputer = UnitScaledImputer(cardio_schema, 3)
    filled = typed_frame(cardio_schema, imputer.impute_groups(numeric, groups))
    assert not filled.iloc[:46].isna().any().any()
    # Changing a row of group 0 changes no imputed value in another group.
    changed = numeric.copy()
    changed.loc[5, "weight"] = 199.0
    refilled = typed_frame(cardio_schema, imputer.impute_groups(changed, groups))
    pd.testing.assert_frame_equal(filled.iloc[30:], refilled.iloc[30:])
    # Row 40's weight comes from donors in its own group (rows 30..39).
    donors = numeric.loc[30:39, "weight"]
    assert donors.min() <= filled.loc[40, "weight"] <= donors.max()
    # A column with no valid value in a group takes the middle of its public range there.
    low, high = cardio_schema.column("height").bounds
    assert (filled.loc[41:45, "height"] == round((low + high) / 2)).all()
    # Rows in no group, and complete rows, pass through unchanged.
    assert np.isnan(imputer.impute_groups(numeric, groups[:1]).loc[40, "weight"])
    pd.testing.assert_frame_equal(filled.iloc[46:], typed_frame(cardio_schema, numeric.iloc[46:]), check_dtype=False)


def test_out_of_bounds_and_bad_levels_become_missing_and_are_imputed(cardio_schema, demo_frame):
    table = demo_frame[cardio_schema.column_names].copy()
    table.loc[0, "height"] = 55  # below the public bound
    table.loc[1, "ap_hi"] = 16020  # implausible
    table.loc[2, "cholesterol"] = 7  # not a level
    table.loc[3, "weight"] = np.nan
    numeric, counts = invalid_to_missing(cardio_schema, table)
    assert counts["height"] == 1 and counts["ap_hi"] == 1 and counts["cholesterol"] == 1 and counts["weight"] == 1
    imputer = UnitScaledImputer(cardio_schema, 3).fit(numeric.iloc[10:])
    complete = typed_frame(cardio_schema, imputer.transform(numeric))
    assert not complete.isna().any().any()
    assert 100 <= complete.loc[0, "height"] <= 210
    assert complete.loc[2, "cholesterol"] in (1, 2, 3)
    # Rows without a gap pass through unchanged.
    untouched = typed_frame(cardio_schema, numeric.iloc[10:20])
    pd.testing.assert_frame_equal(complete.iloc[10:20], untouched, check_dtype=False)
    TableEncoder(cardio_schema).encode(complete)  # encodable: everything valid


def test_imputer_sees_only_the_rows_it_was_fitted_on(cardio_schema, demo_frame):
    table = demo_frame[cardio_schema.column_names].copy()
    numeric, _ = invalid_to_missing(cardio_schema, table)
    gap = numeric.iloc[[0]].copy()
    gap["weight"] = np.nan
    fit_a = UnitScaledImputer(cardio_schema, 3).fit(numeric.iloc[1:1000])
    fit_b = UnitScaledImputer(cardio_schema, 3).fit(
        numeric.iloc[1:1000].assign(weight=numeric["weight"].iloc[1:1000] + 5)
    )
    assert fit_a.transform(gap)["weight"].iloc[0] != fit_b.transform(gap)["weight"].iloc[0]
