"""Pairs of continuous columns coupled inside their cells (models/generators/graphical/coupling.py): a
monotone pair keeps its rank dependence through MST's coarse cells, every column's values inside each
cell stay the ones drawn before, the coupling reads the model alone, and a model released before
couplings decodes as it did."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy.stats import multivariate_normal, spearmanr

from dpsynth.models.data.binning import cell_codes, fine_codes
from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.models.generators.graphical.coupling import ordered_within_cells, polychoric
from dpsynth.models.generators.graphical.model import MSTModel
from dpsynth.models.generators.mst import fit as mst_fit
from dpsynth.models.marginals.shapes import CELL_MEAN, measure_shapes
from dpsynth.models.privacy.secret import PrivacySecret
from tests.conftest import TEST_SECRET_HEX

SECRET = PrivacySecret.from_hex(TEST_SECRET_HEX)
BINS = 20
AGE = Column("age", "continuous", bounds=(17.0, 90.0), decimals=0)
WEIGHT = Column("weight", "continuous", bounds=(10000.0, 1500000.0), decimals=0)
SCHEMA = DatasetSchema.from_dict(
    {
        "name": "coupling_test",
        "target": "y",
        "columns": {
            "age": {"type": "continuous", "bounds": [17.0, 90.0], "decimals": 0},
            "weight": {"type": "continuous", "bounds": [10000.0, 1500000.0], "decimals": 0},
            "y": {"type": "binary", "levels": [0, 1]},
        },
    }
)


def monotone_table(rows: int, seed: int) -> pd.DataFrame:
    """A survey weight with a long right tail rising with age (rank correlation about 0.9): most weights
    fall in the first few of the weight's 20 public bins, so most of the dependence is inside cells."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=rows)
    age = np.clip(np.round(40 + 12 * z), 17, 90)
    weight = np.clip(np.round(np.exp(11.8 + 0.5 * (0.93 * z + 0.37 * rng.normal(size=rows)))), 10000, 1500000)
    y = (rng.random(rows) < 0.3).astype(np.int64)
    return pd.DataFrame({"age": age.astype(np.int64), "weight": weight.astype(np.int64), "y": y})


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return monotone_table(6000, seed=3)


@pytest.fixture(scope="module")
def model(table) -> MSTModel:
    """MST at a generous rho with the columns' shapes, fitted directly on the table (a release's fit)."""
    fitted = mst_fit.fit(table, SCHEMA.columns, 4.0, SECRET.numpy, BINS, iterations=500).model
    fitted.shapes = measure_shapes(table, SCHEMA.columns, 2.0, np.random.default_rng(0), BINS)
    return fitted


def test_a_monotone_pair_keeps_its_rank_correlation_inside_the_cells(model, table):
    """The fitted model couples age and weight; decoded without the coupling (values inside cells
    independent, as before) the pair's rank correlation falls well below the table's."""
    assert [(i, j) for i, j, _ in model.couplings] == [(0, 1)] and model.couplings[0][2] > 0.8
    real = spearmanr(table["age"], table["weight"])[0]
    coupled = model.sample(20_000, np.random.default_rng(1))
    independent = MSTModel(*_parts(model), shapes=model.shapes).sample(20_000, np.random.default_rng(1))
    within_coupled = spearmanr(coupled["age"], coupled["weight"])[0]
    within_independent = spearmanr(independent["age"], independent["weight"])[0]
    assert real > 0.85
    assert within_independent < real - 0.1  # what the cells alone keep (0.77 against 0.92 here)
    assert within_coupled > real - 0.05  # 0.89


def test_the_coupling_keeps_every_value_drawn_inside_its_cell(model):
    """The same draws with and without the coupling: every row keeps its cells, and each cell of each
    continuous column holds the same values, so every fine (1-way) histogram is unchanged; only which row
    holds which value inside a cell moves."""
    coupled = model.sample(8000, np.random.default_rng(7))
    independent = MSTModel(*_parts(model), shapes=model.shapes).sample(8000, np.random.default_rng(7))
    assert not coupled.equals(independent)  # the coupling did something
    assert coupled["y"].equals(independent["y"])
    for col in (AGE, WEIGHT):
        before, after = independent[col.name].to_numpy(), coupled[col.name].to_numpy()
        cells = cell_codes(col, before, BINS)
        assert np.array_equal(cell_codes(col, after, BINS), cells)
        for cell in np.unique(cells):
            assert np.array_equal(np.sort(after[cells == cell]), np.sort(before[cells == cell]))
        assert np.array_equal(np.bincount(fine_codes(col, after, BINS)), np.bincount(fine_codes(col, before, BINS)))


def test_the_coupling_reads_the_model_alone(model):
    """The couplings are a function of the model's tables (no row): a copy of the model's parameters
    fits the same ones, and the released file's arrays decode to the same rows."""
    copy = MSTModel(*_parts(model), shapes=model.shapes)
    assert copy.couplings == ()
    copy.couple()
    assert copy.couplings == model.couplings
    loaded = MSTModel.from_arrays(*model.to_arrays())
    assert loaded.couplings == model.couplings
    pd.testing.assert_frame_equal(
        loaded.sample(3000, np.random.default_rng(4)), model.sample(3000, np.random.default_rng(4))
    )


def test_polychoric_finds_a_normal_tables_correlation_through_an_independent_share():
    """A table cut from a bivariate normal at r = 0.7 (uneven cells, as a long tail's), alone and mixed
    with a quarter of its margins' product (the spread a noisy measurement adds): r is found either way."""
    rows = np.array([-np.inf, -1.5, -0.6, 0.0, 0.3, 0.9, 2.0, np.inf])
    cols = np.array([-np.inf, -0.2, 0.1, 0.5, 1.2, np.inf])
    normal = multivariate_normal(mean=[0.0, 0.0], cov=[[1.0, 0.7], [0.7, 1.0]])
    big = 40.0
    clipped_rows, clipped_cols = np.clip(rows, -big, big), np.clip(cols, -big, big)
    cdf = np.array([[normal.cdf([a, b]) for b in clipped_cols] for a in clipped_rows])
    table = np.diff(np.diff(cdf, axis=0), axis=1)
    assert polychoric(table) == pytest.approx(0.7, abs=0.01)
    mixed = 0.75 * table + 0.25 * np.outer(table.sum(axis=1), table.sum(axis=0))
    assert polychoric(mixed) == pytest.approx(0.7, abs=0.03)
    assert polychoric(table[:, ::-1]) == pytest.approx(-0.7, abs=0.01)
    assert polychoric(np.outer([0.2, 0.5, 0.3], [0.6, 0.4])) == pytest.approx(0.0, abs=0.01)


def test_values_are_handed_out_inside_each_cell_in_the_order_of_the_scores():
    values = np.array([5.0, 1.0, 7.0, 3.0, 100.0, 90.0])
    cells = np.array([0, 0, 0, 0, 1, 1])
    scores = np.array([0.2, -1.0, 3.0, 0.0, -2.0, 2.0])
    assert ordered_within_cells(values, cells, scores).tolist() == [5.0, 1.0, 7.0, 3.0, 90.0, 100.0]


# A model released before couplings (its metadata without the key): the rows the code before them drew
# from `legacy_model()` with default_rng(11) (computed at commit fc26d81).
LEGACY_AGES = [66, 56, 28, 73, 59, 81, 33, 21, 35, 87, 39, 53]
LEGACY_AGE_SUM, LEGACY_WEIGHT_SUM = 21365, 301976985
LEGACY_WEIGHTS = [938843, 749627, 533445, 1154625, 698850, 1200021, 386299, 186412, 639658, 1287914, 754540, 772511]


def legacy_model() -> MSTModel:
    """Two continuous columns and a clique table with a dependence, built by hand (no fit), with shapes as
    a model released before couplings had them (read by the cell-mean rule: no "denoiser" key then)."""
    model = MSTModel.uniform((AGE, WEIGHT), BINS)
    joint = np.fromfunction(lambda a, b: np.exp(-((a - b) ** 2) / 8.0), (BINS, BINS))
    model.cliques, model.tables, model.parents = [(0, 1)], [joint / joint.sum()], [-1]
    frame = monotone_table(3000, seed=5)
    model.shapes = replace(
        measure_shapes(frame, (AGE, WEIGHT), 1.0, np.random.default_rng(2), BINS), denoiser=CELL_MEAN
    )
    return model


def test_a_model_released_before_couplings_decodes_as_before():
    model = legacy_model()
    arrays, meta = model.to_arrays()
    assert "couplings" not in meta  # none fitted: the file is the earlier layout
    rows = MSTModel.from_arrays(arrays, meta).sample(400, np.random.default_rng(11))
    assert rows["age"].tolist()[:12] == LEGACY_AGES and rows["weight"].tolist()[:12] == LEGACY_WEIGHTS
    assert int(rows["age"].sum()) == LEGACY_AGE_SUM and int(rows["weight"].sum()) == LEGACY_WEIGHT_SUM
    model.couple()  # the same tables fitted now: the pair is coupled, and the file says so
    assert model.couplings and MSTModel.from_arrays(*model.to_arrays()).couplings == model.couplings


def _parts(model: MSTModel) -> tuple:
    return (model.columns, model.bins, model.maps, model.cliques, model.tables, model.parents)
