"""Numeric shapes scored against the real table: cells at the real quantiles that see a heap the public
bins blur, ties never split, the Kolmogorov-Smirnov distance as scipy and SDMetrics compute it, and 2-way
TVD that sees a numeric x numeric dependence inside one public bin."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.models.evaluation.fidelity import (
    FIDELITY_TARGETS,
    column_tvd,
    fidelity_summary,
    fidelity_verdicts,
    ks_distances,
    pairwise_tvd,
    quantile_column_tvd,
    quantile_pairwise_tvd,
)
from dpsynth.models.evaluation.shapes import MISSING, ks_distance, quantile_cells

# Hours worked as in a census: integers 1 to 99 (20 public bins of 4.9), about half the rows at exactly 40.
SCHEMA = {
    "name": "hours",
    "target": "flag",
    "columns": {
        "flag": {"type": "binary", "levels": [0, 1]},
        "hours": {"type": "continuous", "bounds": [1.0, 99.0]},
        "weight": {"type": "continuous", "bounds": [0.0, 1000.0], "decimals": 1, "point_masses": [0.0]},
    },
}
HEAP, ROWS = 40.0, 4000
# The public bin that holds 40: [35.3, 40.2), integers 36 to 40.
HEAP_BIN = np.arange(36.0, 41.0)


@pytest.fixture(scope="module")
def schema() -> DatasetSchema:
    return DatasetSchema.from_dict(SCHEMA)


def heaped_table(seed: int, rows: int = 20_000) -> pd.DataFrame:
    """47% of the rows at 40 hours, the rest spread over 1-99 around 40; weight independent of hours."""
    rng = np.random.default_rng(seed)
    hours = np.where(rng.random(rows) < 0.47, HEAP, np.clip(np.round(rng.normal(40, 12, rows)), 1, 99))
    weight = np.where(rng.random(rows) < 0.1, 0.0, np.round(rng.gamma(2.0, 80.0, rows), 1).clip(0.1, 1000))
    return pd.DataFrame({"flag": rng.integers(0, 2, rows), "hours": hours, "weight": weight})


def spread_heap(frame: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The release that spreads the heap uniformly over its public bin: every public-bin count unchanged."""
    spread = frame.copy()
    at_heap = spread["hours"] == HEAP
    spread.loc[at_heap, "hours"] = np.random.default_rng(seed).choice(HEAP_BIN, int(at_heap.sum()))
    return spread


def test_quantile_cells_see_a_heap_spread_over_its_bin_that_public_bins_cannot(schema):
    real, kept = heaped_table(seed=1), heaped_table(seed=2)  # kept: another draw that keeps the heap
    spread = spread_heap(kept, seed=3)
    public_kept, public_spread = column_tvd(schema, real, kept), column_tvd(schema, real, spread)
    assert public_spread["hours"] == pytest.approx(public_kept["hours"], abs=1e-12)  # public bins: no difference
    quantile_kept = quantile_column_tvd(schema, real, kept)["hours"]
    quantile_spread = quantile_column_tvd(schema, real, spread)["hours"]
    assert quantile_kept < 0.03
    assert quantile_spread > 0.3  # 4/5 of the 47% heap left its cell
    summary = fidelity_summary(schema, real, spread)
    assert summary["continuous_quantile_tvd"]["hours"] == pytest.approx(quantile_spread)
    assert summary["continuous_quantile_tvd_worst_column"] == "hours"
    assert summary["quantile_heaps"]["hours"] == [HEAP]
    assert fidelity_verdicts(summary)["continuous_quantile_tvd_worst"]["verdict"] == "missed"
    assert fidelity_verdicts(fidelity_summary(schema, real, kept))["continuous_quantile_tvd_worst"]["verdict"] == "met"


def test_a_heap_or_point_mass_gets_a_cell_of_its_own_and_no_value_is_split(schema):
    real = heaped_table(seed=1)
    hours = quantile_cells(schema.column("hours"), real["hours"])
    assert list(hours.heaps) == [HEAP]
    codes = hours.codes(real["hours"])
    heap_cell = len(hours.edges) + 1
    assert (codes[real["hours"] == HEAP] == heap_cell).all() and (codes[real["hours"] != HEAP] < heap_cell).all()
    for value in np.unique(real["hours"]):  # a tied value lies in one cell, never across two
        assert len(np.unique(codes[real["hours"] == value])) == 1
    # Outside the heap, each interval holds about 1/20 of the other rows (integers: edges fall between values).
    shares = np.bincount(codes[codes < heap_cell]) / (codes < heap_cell).sum()
    assert len(shares) >= 15 and shares.max() < 0.1
    assert hours.labels()[-1] == "=40" and hours.labels()[0].startswith("(-inf, ")
    # The declared point mass has its cell whatever its share; missing values are coded as missing.
    weight = quantile_cells(schema.column("weight"), real["weight"])
    assert 0.0 in weight.heaps
    assert list(weight.codes(pd.Series([np.nan, 0.0, "x"]))) == [MISSING, len(weight.edges) + 1, MISSING]


def test_heaps_are_found_until_none_is_left():
    """A value at 4% of the rows (under 1/20) holds 7.5% of the rows once the 47% heap is out: a cell of its own."""
    col = Column(name="hours", kind="continuous", bounds=(1.0, 99.0))
    values = np.r_[np.full(470, 40.0), np.full(40, 50.0), np.arange(490) % 98 + 1.0]
    values = np.where((values == 40.0) | (values == 50.0), values, np.where(values >= 40, values + 11, values))
    cells = quantile_cells(col, values)
    assert list(cells.heaps) == [40.0, 50.0]
    # A column of few values: every value its own cell, nothing left for quantiles.
    few = quantile_cells(col, np.r_[np.full(50, 1.0), np.full(30, 2.0), np.full(20, 3.0)])
    assert list(few.heaps) == [1.0, 2.0, 3.0] and len(few.edges) == 0 and few.size == 4


def test_cells_follow_the_real_rows_only(schema):
    """The synthetic table never moves the cells: a heap only the synthetic table has gets no cell of its
    own and is scored on the real table's cells."""
    real = heaped_table(seed=1)
    synth = real.copy()
    synth.loc[synth.index[:6000], "hours"] = 25.0  # 30% of the synthetic rows at 25, a value the real rows spread
    cells = quantile_cells(schema.column("hours"), real["hours"])
    assert 25.0 not in cells.heaps
    real_shares = np.bincount(cells.codes(real["hours"]), minlength=cells.size) / len(real)
    synth_shares = np.bincount(cells.codes(synth["hours"]), minlength=cells.size) / len(synth)
    expected = 0.5 * np.abs(real_shares - synth_shares).sum()
    assert quantile_column_tvd(schema, real, synth)["hours"] == pytest.approx(expected, abs=1e-12)
    assert fidelity_summary(schema, real, synth)["quantile_heaps"] == {"hours": [HEAP], "weight": [0.0]}


def test_ks_distance_is_scipys_statistic_and_one_minus_sdmetrics_ks_complement(schema):
    assert ks_distance([1, 2, 3, 4], [3, 4, 5, 6]) == 0.5  # F_real(2) = 0.5, F_synthetic(2) = 0
    assert ks_distance([1, 2, 2, 3], [1, 2, 2, 3]) == 0.0
    assert ks_distance([np.nan, None], [1.0]) is None
    rng = np.random.default_rng(7)
    real = pd.Series(np.round(rng.gamma(2.0, 3.0, 300), 1))  # ties at one decimal
    synth = pd.Series(np.round(rng.gamma(2.2, 3.0, 250), 1))
    synth[:10] = np.nan  # missing values are ignored, as SDMetrics ignores them
    expected = stats.ks_2samp(real, synth.dropna()).statistic
    assert ks_distance(real, synth) == pytest.approx(expected, abs=1e-12)
    from sdmetrics.single_column import KSComplement

    assert ks_distance(real, synth) == pytest.approx(1.0 - KSComplement.compute(real, synth), abs=1e-12)
    frame_real, frame_synth = heaped_table(seed=1), spread_heap(heaped_table(seed=2), seed=3)
    distances = ks_distances(schema, frame_real, frame_synth)
    assert list(distances.index) == ["hours", "weight"]
    for name in distances.index:
        assert distances[name] == pytest.approx(stats.ks_2samp(frame_real[name], frame_synth[name]).statistic)
    summary = fidelity_summary(schema, frame_real, frame_synth)
    assert summary["continuous_ks"] == pytest.approx(distances.to_dict())
    assert summary["continuous_ks_worst"] == pytest.approx(distances.max())


def test_two_way_tvd_covers_numeric_pairs_on_real_quantile_cells(schema):
    """hours and weight rise together inside one public bin each: public cells see no pair at all,
    real-quantile cells see the dependence a shuffle broke behind unchanged marginals."""
    rng = np.random.default_rng(4)
    hours = rng.integers(36, 41, ROWS).astype(np.float64)  # one public bin of hours
    weight = np.round(0.5 + (hours - 36) * 10 + rng.random(ROWS) * 9.0, 1)  # within [0.5, 49.5]: one bin of 50
    real = pd.DataFrame({"flag": rng.integers(0, 2, ROWS), "hours": hours, "weight": weight})
    synth = real.copy()
    synth["weight"] = rng.permutation(weight)
    pair = ("hours", "weight")
    assert pairwise_tvd(schema, real, synth).tvd[pair] == 0.0
    quantile = quantile_pairwise_tvd(schema, real, synth)
    assert list(quantile.tvd.index) == [("flag", "hours"), ("flag", "weight"), pair]
    assert quantile.tvd[pair] > 0.5 and quantile.worst_pair == pair
    assert (quantile_column_tvd(schema, real, synth) == 0.0).all()
    summary = fidelity_summary(schema, real, synth)
    assert summary["pairwise_quantile_tvd_worst_pair"] == list(pair)
    assert summary["pairwise_quantile_tvd_worst"] == pytest.approx(quantile.tvd[pair])
    assert summary["pairwise_tvd_worst"] < 0.1  # the public-bin figure beside it stays blind


def test_shape_targets_are_the_issues():
    assert {
        figure: FIDELITY_TARGETS[figure]
        for figure in (
            "continuous_quantile_tvd_worst",
            "continuous_ks_worst",
            "pairwise_quantile_tvd_mean",
            "pairwise_quantile_tvd_worst",
        )
    } == {
        "continuous_quantile_tvd_worst": 0.03,
        "continuous_ks_worst": 0.05,
        "pairwise_quantile_tvd_mean": 0.04,
        "pairwise_quantile_tvd_worst": 0.15,
    }
