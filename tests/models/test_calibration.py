"""Calibration of synthetic rows to measured marginals: post-processing of synthetic rows only."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pandas as pd
import pytest

from dpsynth.models.data.binning import cell_codes, cell_count, writable_cells
from dpsynth.models.data.demo import SHAPES, make_demo_table
from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.models.marginals.calibration import (
    _values_in_cells,
    calibrate,
    marginal_distances,
    move_rows,
    rake,
    systematic_resample,
)
from dpsynth.models.marginals.measure import (
    candidate_pairs,
    flat_cells,
    marginal_counts,
    measure,
    plan_for_rho,
)
from dpsynth.models.privacy.secret import PrivacySecret

SECRET = PrivacySecret.from_hex("5e" * 32)
ROWS = 4000
SCHEMA = {
    "name": "small",
    "target": "target",
    "columns": {
        "age": {"type": "continuous", "bounds": [17, 90], "decimals": 0},
        "hours": {"type": "continuous", "bounds": [1, 99], "decimals": 0},
        "gain": {"type": "continuous", "bounds": [0, 10000], "decimals": 0, "point_masses": [0]},
        # Bins of 0.75 years on an integer grid: some bins hold no writable value.
        "schooling": {"type": "continuous", "bounds": [1, 16], "decimals": 0},
        "colour": {"type": "categorical", "levels": ["red", "green", "blue", "black", "white"]},
        "flag": {"type": "binary", "levels": ["no", "yes"]},
        "target": {"type": "binary", "levels": [0, 1]},
    },
}


@pytest.fixture(scope="module")
def schema() -> DatasetSchema:
    return DatasetSchema.from_dict(SCHEMA)


@pytest.fixture(scope="module")
def real(schema) -> pd.DataFrame:
    return make_demo_table(schema, ROWS, seed=1, shape=SHAPES["hard"])


@pytest.fixture(scope="module")
def measured(schema, real):
    # A generous budget: the measured shares are close to the real ones, so distances to the real table
    # below are about calibration, not noise.
    return measure(real, schema, plan_for_rho(schema, 20.0), SECRET)


def _distorted(schema) -> pd.DataFrame:
    """A generator's table that got some shares wrong: colour shifted by 0.2 (and a level missing), the
    point mass at 0 missing (those rows hold small positive amounts), ages noisy."""
    rng = np.random.default_rng(11)
    synth = make_demo_table(schema, ROWS, seed=2, shape=SHAPES["hard"])
    shift = (synth["colour"] == "red") & (rng.random(ROWS) < 0.45)
    synth.loc[shift, "colour"] = "blue"
    synth.loc[synth["colour"] == "white", "colour"] = "black"
    zero = synth["gain"] == 0
    synth.loc[zero, "gain"] = rng.integers(1, 300, int(zero.sum()))
    synth["age"] = np.clip(synth["age"] + rng.integers(-3, 4, ROWS), 17, 90)
    return synth


def _one_way_distances(frame, schema, measured) -> dict:
    return {k[0]: v for k, v in marginal_distances(frame, schema, measured).items() if len(k) == 1}


def _two_way_tvd(a: pd.DataFrame, b: pd.DataFrame, schema, pairs) -> float:
    out = []
    for pair in pairs:
        ca, cb = marginal_counts(a, schema, pair), marginal_counts(b, schema, pair)
        out.append(0.5 * np.abs(ca / ca.sum() - cb / cb.sum()).sum())
    return float(np.mean(out))


def test_calibration_brings_a_distorted_table_to_the_measured_shares(schema, measured):
    synth = _distorted(schema)
    before = _one_way_distances(synth, schema, measured)
    assert before["colour"] > 0.15 and before["gain"] > 0.5
    out = calibrate(synth, schema, measured, np.random.default_rng(0))
    after = _one_way_distances(out, schema, measured)
    assert len(out) == ROWS and list(out.columns) == list(synth.columns)
    assert np.mean(list(after.values())) <= 0.003, after
    assert max(after.values()) <= 0.003, after
    # The point mass is back, with exactly its value and its measured share.
    assert abs(np.mean(out["gain"] == 0) - measured.one_way("gain")[-1]) <= 0.005
    # A level no synthetic row had now has its measured share.
    white = schema.column("colour").levels.index("white")
    assert abs(np.mean(out["colour"] == "white") - measured.one_way("colour")[white]) <= 0.003


def test_the_output_is_a_valid_table(schema, measured):
    synth = _distorted(schema)
    out = calibrate(synth, schema, measured, np.random.default_rng(0), rows=2500)
    assert len(out) == 2500
    assert (out.dtypes == synth.dtypes).all()
    for col in schema.columns:
        values = out[col.name]
        if col.is_continuous:
            assert values.between(*col.bounds).all(), col.name
            assert np.allclose(values, values.round(col.decimals)), col.name
        else:
            assert set(values) <= set(col.levels), col.name
    # Every value the calibration wrote lies in a writable cell: no 3.25 years of schooling.
    schooling = schema.column("schooling")
    codes = cell_codes(schooling, out["schooling"].to_numpy())
    assert set(codes) <= set(cell_codes(schooling, np.arange(1, 17)))


def test_joint_structure_of_a_good_table_is_kept(schema, real, measured):
    synth = make_demo_table(schema, ROWS, seed=3, shape=SHAPES["hard"])  # the generating process, other rows
    out = calibrate(synth, schema, measured, np.random.default_rng(0))
    pairs = candidate_pairs(schema, [m.columns for m in measured.marginals])
    assert _two_way_tvd(out, real, schema, pairs) <= _two_way_tvd(synth, real, schema, pairs) + 0.01
    # Most rows needed no edit: they are the generator's rows exactly.
    kept = out.merge(synth.drop_duplicates(), how="left", indicator=True)["_merge"].eq("both").mean()
    assert kept >= 0.85


def test_joint_structure_survives_a_distorted_table(schema, real, measured):
    synth = _distorted(schema)
    out = calibrate(synth, schema, measured, np.random.default_rng(0))
    pairs = candidate_pairs(schema, [m.columns for m in measured.marginals])
    assert _two_way_tvd(out, real, schema, pairs) <= _two_way_tvd(synth, real, schema, pairs) + 0.01
    # age and hours share a factor in the generating process: their correlation survives.
    assert np.corrcoef(out["age"], out["hours"])[0, 1] > 0.5 * np.corrcoef(synth["age"], synth["hours"])[0, 1]


def test_calibration_reads_only_synthetic_rows_marginals_and_its_rng(schema, measured):
    parameters = list(inspect.signature(calibrate).parameters)
    assert parameters[:4] == ["synthetic", "schema", "measured", "rng"]
    assert not any("real" in p or "train" in p for p in parameters)
    synth = _distorted(schema)
    first = calibrate(synth, schema, measured, np.random.default_rng(5))
    again = calibrate(synth.copy(), schema, measured, np.random.default_rng(5))
    other = calibrate(synth, schema, measured, np.random.default_rng(6))
    pd.testing.assert_frame_equal(first, again)
    assert not first.equals(other)


def test_missing_synthetic_values_are_filled(schema, measured):
    synth = _distorted(schema)
    synth["colour"] = synth["colour"].astype(object)
    synth.loc[:199, "colour"] = None
    synth.loc[200:399, "hours"] = np.nan
    out = calibrate(synth, schema, measured, np.random.default_rng(0))
    assert not out[["colour", "hours"]].isna().any().any()
    assert max(_one_way_distances(out, schema, measured).values()) <= 0.003


# ------------------------------------------------------------------------------------- the pieces


def test_systematic_resampling_is_low_variance():
    weights = np.array([0.5, 0.25, 0.125, 0.125])
    picks = systematic_resample(weights, 10, np.random.default_rng(0))
    counts = np.bincount(picks, minlength=4)
    assert counts.sum() == 10
    assert np.all(np.abs(counts - 10 * weights) < 1)


def test_raking_reaches_reachable_margins():
    rng = np.random.default_rng(1)
    codes = np.stack([rng.integers(0, 3, 5000), rng.integers(0, 2, 5000)], axis=1)
    a, b = np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.9])
    weights = rake(codes, [[0], [1]], [(3,), (2,)], [a, b], max_weight=100.0)
    np.testing.assert_allclose(np.bincount(codes[:, 0], weights, 3), a, atol=1e-3)
    np.testing.assert_allclose(np.bincount(codes[:, 1], weights, 2), b, atol=1e-3)


def test_moving_rows_reaches_a_target_with_empty_cells():
    rng = np.random.default_rng(2)
    codes = np.stack([rng.integers(0, 2, 1000), rng.integers(0, 3, 1000)], axis=1)  # cell 3 of column 1: empty
    target = np.array([[100, 200, 150, 50], [150, 100, 200, 50]])
    moved = move_rows(codes, [0, 1], (2, 4), target.ravel(), rng)
    assert moved > 0
    np.testing.assert_array_equal(np.bincount(flat_cells(codes, (2, 4)), minlength=8), target.ravel())


def test_moves_change_one_column_when_that_suffices():
    codes = np.array([[0, 0]] * 6 + [[1, 1]] * 4)
    before = codes.copy()
    move_rows(codes, [0, 1], (2, 2), np.array([4, 2, 0, 4]), np.random.default_rng(0))
    changed = codes != before
    assert changed.any(axis=1).sum() == 2
    assert not changed[:, 0].any()  # only column 1 moved: rows (0, 0) became (0, 1)


def test_measured_cells_are_the_schema_cells(schema, measured):
    for marginal in measured.marginals:
        assert marginal.shape == tuple(cell_count(schema.column(n), measured.bins) for n in marginal.columns)
        assert len(marginal.shares) == math.prod(marginal.shape)


@pytest.mark.parametrize(
    "col",
    [
        Column("age", "continuous", bounds=(17, 90)),  # a bin edge at 57.15: rounding leaves bin 11
        Column("share", "continuous", bounds=(0, 1), decimals=2, point_masses=(0.0, 0.5)),  # edges at 0.3, 0.35
        Column("schooling", "continuous", bounds=(1, 16)),  # bins narrower than the integer step
    ],
)
def test_written_values_fall_in_their_cell_on_the_decimal_grid(col):
    writable = np.nonzero(writable_cells(col, 20))[0]
    codes = np.repeat(writable, 500)
    values = _values_in_cells(col, codes, np.random.default_rng(0), 20)
    np.testing.assert_array_equal(cell_codes(col, values), codes)
    np.testing.assert_allclose(values, np.round(values, col.decimals), atol=1e-9)
    assert len(writable) == (16 if col.name == "schooling" else cell_count(col))  # 16 integers, 4 empty bins
