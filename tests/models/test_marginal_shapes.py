"""Column shapes (models/marginals/shapes.py, binning's fine cells): cells chosen from public facts only,
nested in the coarse cells; the fine histograms' cost inside the rho the accountant composes; a heaped
value that survives MST's sampling and the calibration."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dpsynth.models.config import MarginalsConfig, PrivacyConfig, Profile, Setting
from dpsynth.models.data.binning import (
    FINE_SPLIT,
    cell_codes,
    cell_count,
    fine_cell_count,
    fine_codes,
    fine_parents,
    shaped_cell_values,
)
from dpsynth.models.data.demo import SHAPES, make_demo_table
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.models.generators import get
from dpsynth.models.generators.base import TrainingJob
from dpsynth.models.generators.graphical import zcdp_adapter
from dpsynth.models.generators.graphical.mechanisms import epsilon_of
from dpsynth.models.generators.mst.config import MSTConfig
from dpsynth.models.generators.mst.sampler import model_of
from dpsynth.models.marginals.calibration import calibrate
from dpsynth.models.marginals.measure import measure, plan_for_rho, rho_of
from dpsynth.models.marginals.shapes import denoised, measure_shapes, shape_noise_multiplier
from dpsynth.models.privacy.secret import PrivacySecret

SECRET = PrivacySecret.from_hex("3c" * 32)
CENSUS = DatasetSchema.from_yaml(Path(__file__).resolve().parents[2] / "configs" / "census-demo.yaml")
HOURS = Column("hours", "continuous", bounds=(1.0, 99.0), decimals=0)
WEIGHT = Column("weight", "continuous", bounds=(10000.0, 1500000.0), decimals=0, point_masses=(10000.0,))


# The heaped census table's shaped columns, one categorical column and the target: a quick MST fit.
NARROW = DatasetSchema(
    "heaped_part",
    1,
    "income",
    tuple(CENSUS.column(n) for n in ("age", "final_weight", "hours_per_week", "sex", "income")),
)


@pytest.fixture(scope="module")
def heaped() -> pd.DataFrame:
    return make_demo_table(CENSUS, 6000, seed=3, shape=SHAPES["heaped"])


def test_a_narrow_grid_gets_a_cell_per_value_and_a_wide_column_sixteen_per_cell_nested_in_its_cells():
    assert fine_cell_count(HOURS) == 99 and fine_cell_count(WEIGHT) == 20 * FINE_SPLIT + 1
    assert fine_cell_count(Column("c", "categorical", levels=("a", "b"))) == 0
    rng = np.random.default_rng(0)
    for col, values in (
        (HOURS, np.arange(1, 100)),
        (WEIGHT, np.concatenate([[10000.0], np.round(rng.uniform(10000, 1500000, 5000))])),
    ):
        parents = fine_parents(col)
        assert len(parents) == fine_cell_count(col) and set(parents) == set(range(cell_count(col)))
        # Each value's fine cell lies in its coarse cell.
        assert (parents[fine_codes(col, values)] == cell_codes(col, values)).all()
    assert (fine_codes(HOURS, [1, 40, 99]) == [0, 39, 98]).all()
    assert fine_codes(WEIGHT, [10000.0])[0] == 20 * FINE_SPLIT  # the point mass: a fine cell of its own


def test_the_same_cells_for_two_tables_that_differ_in_one_row(heaped):
    """Cells come from the schema alone: a table with one row replaced by an extreme one has the same plan
    and the same cells, and with the same noise its fine histograms differ by that one row (L2 sqrt 2)."""
    other = heaped.copy()
    other.loc[0, ["hours_per_week", "final_weight", "age"]] = [99, 1500000, 90]
    columns = [c for c in CENSUS.columns if c.is_continuous]
    for col in columns:
        same = np.arange(1, len(heaped))
        assert (
            fine_codes(col, heaped[col.name].to_numpy())[same] == fine_codes(col, other[col.name].to_numpy())[same]
        ).all()
    a = measure_shapes(heaped, columns, 3.0, np.random.default_rng(7), 20)
    b = measure_shapes(other, columns, 3.0, np.random.default_rng(7), 20)
    for col in columns:
        assert len(a.counts[col.name]) == len(b.counts[col.name]) == fine_cell_count(col)
        moved = np.asarray(a.counts[col.name]) - np.asarray(b.counts[col.name])
        assert np.linalg.norm(moved) <= math.sqrt(2) + 1e-12 and np.abs(moved).sum() <= 2


def test_a_shape_places_values_inside_their_cell_as_its_weights_say():
    shape = np.zeros(99)
    shape[[38, 39]] = [1.0, 3.0]  # 39 and 40, both in the cell [35.3, 40.2)
    codes = cell_codes(HOURS, np.full(8000, 40))
    values = shaped_cell_values(HOURS, codes, shape, np.random.default_rng(1))
    assert set(np.unique(values)) == {39.0, 40.0} and abs((values == 40).mean() - 0.75) < 0.02
    # A cell whose weights are all 0 (or negative: noisy counts) is uniform over its values.
    other = shaped_cell_values(HOURS, cell_codes(HOURS, np.full(5000, 2)), -shape, np.random.default_rng(1))
    assert set(np.unique(other)) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert (cell_codes(HOURS, other) == cell_codes(HOURS, np.full(5000, 2))).all()


def test_denoising_keeps_a_heap_and_flattens_what_noise_alone_could_make():
    """Within a coarse cell, counts that differ by no more than noise are shrunk to their mean (uniform
    within the cell); a heap far above the noise keeps nearly its measured count."""
    rng = np.random.default_rng(4)
    parents = np.repeat([0, 1], 16)
    flat = np.full(32, 100.0)
    flat[16 + 5] = 3000.0  # a heap in the second cell
    noisy = flat + rng.normal(0.0, 50.0, 32)
    weights = denoised(noisy, parents, 50.0)
    assert np.ptp(weights[:16]) < 0.5 * np.ptp(noisy[:16])  # pulled towards uniform
    measured = noisy[21] / noisy[16:].sum()  # the heap's share as measured (3000 of 4500 before noise)
    assert weights[21] / weights[16:].sum() == pytest.approx(measured, abs=0.01) and measured > 0.6
    assert (weights >= 0).all() and np.allclose(denoised(noisy, parents, 0.0), np.clip(noisy, 0, None))


def _mst_profile(shape_share: float, rho: float | None = None) -> Profile:
    return Profile(
        name="t",
        generator="mst",
        settings=(Setting("s"),),
        privacy=PrivacyConfig(epsilon_budget=1.0),
        marginals=MarginalsConfig(enabled=False),
        mst=MSTConfig(rho=rho, iterations=300, shape_share=shape_share),
    )


def test_the_shapes_cost_a_declared_share_of_msts_rho_inside_the_accounted_epsilon():
    """The accountant composes MST's whole rho; the shapes take `shape_share` of it and the fit the rest,
    so the release's epsilon is the same at every share (within the budget) and what each part spends
    adds up to it."""
    for rho in (None, 0.01):
        epsilons = set()
        for share in (0.0, 0.1, 0.3):
            profile = _mst_profile(share, rho)
            setting = profile.release_target()
            whole = zcdp_adapter.training_rho(profile, setting, "mst")
            shapes = zcdp_adapter.shape_rho(profile, setting, "mst")
            assert shapes == pytest.approx(share * whole, rel=1e-12)
            assert shapes + zcdp_adapter.model_rho(profile, setting, "mst") == pytest.approx(whole, rel=1e-12)
            plan = get("mst").plan(profile, setting)
            assert plan.epsilon == epsilon_of(whole, 1e-5) <= 1.0
            epsilons.add(plan.epsilon)
            facts = get("mst").training_facts(profile, setting).parameters
            parts = ("mst_rho_shapes", "mst_rho_one_way", "mst_rho_selection", "mst_rho_two_way")
            assert sum(facts[k] for k in parts) == pytest.approx(whole, rel=1e-12)
        assert len(epsilons) == 1
    # Six continuous columns share it equally: each fine histogram costs share x rho / 6.
    sigma = shape_noise_multiplier(0.1 * 0.01, 6)
    assert 6 * rho_of(sigma) == pytest.approx(0.1 * 0.01, rel=1e-12)


def _mst_release(table: pd.DataFrame, share: float, tmp_path: Path) -> pd.DataFrame:
    profile = _mst_profile(share)
    setting = profile.release_target()
    table = table[NARROW.column_names]
    data = TableEncoder(NARROW).encode(table).astype(np.float32)
    generator = get("mst")
    plan = generator.plan(profile, setting)
    result = generator.fit(TrainingJob(profile, setting, NARROW, data, SECRET, tmp_path), tmp_path, plan)
    blob = torch.load(tmp_path / "checkpoints" / result.ledger[-1]["generator"], weights_only=True)
    model = model_of(blob)
    if share:
        rho = zcdp_adapter.shape_rho(profile, setting, "mst")
        assert model.shapes is not None and model.shapes.rho() == pytest.approx(rho, rel=1e-12)
    return model.sample(len(table), np.random.default_rng(0))


def test_a_heaped_value_survives_msts_sampling(heaped, tmp_path):
    """On the heaped shape at epsilon 1, MST keeps the share of rows at 40 hours and of ages ending in 0
    or 5 within a few points; values drawn uniformly within their cells (share 0) spread the heap."""
    real_heap, real_round = (heaped["hours_per_week"] == 40).mean(), (heaped["age"] % 5 == 0).mean()
    shaped = _mst_release(heaped, 0.1, tmp_path / "shaped")
    assert abs((shaped["hours_per_week"] == 40).mean() - real_heap) < 0.04
    assert abs((shaped["age"] % 5 == 0).mean() - real_round) < 0.05
    uniform = _mst_release(heaped, 0.0, tmp_path / "uniform")
    assert (uniform["hours_per_week"] == 40).mean() < real_heap - 0.25


def test_the_calibration_moves_values_onto_the_measured_heap(heaped):
    """Rows the calibration moves into the cell that holds 40 hours land on 40 as often as the measured
    fine histogram says, not uniformly over the cell's five values."""
    plan = plan_for_rho(CENSUS, 1.0, shape_share=0.2)
    measured = measure(heaped, CENSUS, plan, SECRET)
    assert measured.shapes is not None and set(measured.shapes.counts) == set(plan.shape_columns)
    synthetic = heaped.copy()
    synthetic["hours_per_week"] = np.random.default_rng(2).integers(1, 12, len(heaped))  # every row moves
    out = calibrate(synthetic, CENSUS, measured, np.random.default_rng(3))
    assert abs((out["hours_per_week"] == 40).mean() - (heaped["hours_per_week"] == 40).mean()) < 0.03
