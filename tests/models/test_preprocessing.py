import numpy as np
import pandas as pd

from models.encoding import TableEncoder
from models.preprocessing import (
    UnitScaledImputer,
    invalid_to_missing,
    stratified_split,
    stratified_subsample,
    typed_frame,
)


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


def test_subsample_keeps_proportions():
    y = np.array([0] * 600 + [1] * 400)
    rows = stratified_subsample(y, 100, seed=0)
    assert len(rows) == 100 and abs(y[rows].mean() - 0.4) < 0.011


def test_out_of_bounds_and_bad_levels_become_missing_and_are_imputed(cardio_schema, demo_frame):
    table = demo_frame[cardio_schema.column_names].copy()
    table.loc[0, "height"] = 55          # below the public bound
    table.loc[1, "ap_hi"] = 16020        # implausible
    table.loc[2, "cholesterol"] = 7      # not a level
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
    fit_b = UnitScaledImputer(cardio_schema, 3).fit(numeric.iloc[1:1000].assign(weight=numeric["weight"].iloc[1:1000] + 5))
    assert fit_a.transform(gap)["weight"].iloc[0] != fit_b.transform(gap)["weight"].iloc[0]
