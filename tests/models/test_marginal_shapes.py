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
    decimal_grid,
    fine_cell_count,
    fine_cell_values,
    fine_codes,
    fine_parents,
    fine_whole,
    shaped_cell_values,
    whole_split,
)
from dpsynth.models.data.demo import SHAPES, make_demo_table
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators import get
from dpsynth.models.generators.base import TrainingJob
from dpsynth.models.generators.graphical import zcdp_adapter
from dpsynth.models.generators.graphical.mechanisms import epsilon_of
from dpsynth.models.generators.graphical.model import MSTModel
from dpsynth.models.generators.mst.config import MSTConfig
from dpsynth.models.generators.mst.sampler import model_of
from dpsynth.models.marginals.calibration import calibrate
from dpsynth.models.marginals.measure import measure, plan_for_rho, rho_of
from dpsynth.models.marginals.shapes import (
    CELL_MEAN,
    NEIGHBOURS,
    ColumnShapes,
    _running_median,
    denoised,
    measure_shapes,
    neighbour_denoised,
    shape_noise_multiplier,
)
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


# ---------------------------------------------------------------- whole numbers in a decimal column

CARDIO = DatasetSchema.from_yaml(Path(__file__).resolve().parents[2] / "configs" / "cardio.yaml")
KG = CARDIO.column("weight")  # 35-200 kg at one decimal: 1,651 grid values, so 16 sub-bins of 0.52 kg a cell
MASSED = Column("amount", "continuous", bounds=(0.0, 1000.0), decimals=2, point_masses=(0.0, 500.0, 2.5))
WHOLE_PART = DatasetSchema(
    "whole_part", 1, "cardio", tuple(CARDIO.column(n) for n in ("height", "weight", "cholesterol", "cardio"))
)


def heaped_at_whole_kilograms(rows: int, seed: int) -> pd.DataFrame:
    """Weights recorded at whole kilograms in 90% of rows, 12% of all rows at exactly 65.0 kg."""
    rng = np.random.default_rng(seed)
    weight = np.clip(np.round(rng.normal(75.0, 12.0, rows), 1), 35.0, 200.0)
    weight = np.where(rng.random(rows) < 0.9, np.round(weight), weight)
    weight = np.where(rng.random(rows) < 0.12, 65.0, weight)
    height = np.clip(np.round(rng.normal(165.0, 8.0, rows)), 100, 210).astype(np.int64)
    return pd.DataFrame(
        {
            "height": height,
            "weight": weight,
            "cholesterol": rng.choice([1, 2, 3], rows, p=[0.7, 0.2, 0.1]),
            "cardio": (rng.random(rows) < 1.0 / (1.0 + np.exp(-(weight - 75.0) / 10.0))).astype(np.int64),
        }
    )


def _whole_share(values: np.ndarray) -> float:
    return float(np.mean(values == np.rint(values)))


def test_a_decimal_columns_whole_numbers_get_fine_cells_of_their_own_and_each_value_exactly_one():
    """A sub-bin that holds a whole number and other grid values is split into an "at a whole number"
    and a "not at one" cell (public: bounds and decimals); every grid value codes to exactly one fine
    cell, inside its coarse cell, and no fine cell is empty of grid values."""
    assert fine_codes(KG, [65.0])[0] != fine_codes(KG, [65.1])[0]  # one sub-bin [64.9, 65.4) before
    assert fine_parents(KG)[fine_codes(KG, [65.0])[0]] == fine_parents(KG)[fine_codes(KG, [65.1])[0]]
    split = whole_split(KG)
    assert split is not None and len(split) == 20 * FINE_SPLIT and split.sum() == 166  # the wholes 35..200
    assert fine_cell_count(KG) == 20 * FINE_SPLIT + 166 and fine_cell_count(KG, whole_cells=False) == 320
    assert whole_split(HOURS) is None and whole_split(WEIGHT) is None  # a value per cell; no decimals
    for col in (KG, MASSED):
        grid = decimal_grid(col)
        codes = fine_codes(col, grid)
        assert codes.min() >= 0 and codes.max() < fine_cell_count(col)
        assert (np.bincount(codes, minlength=fine_cell_count(col)) > 0).all()
        assert (fine_parents(col)[codes] == cell_codes(col, grid)).all()
        at_mass = np.isin(grid, col.point_masses)
        whole = fine_whole(col)
        assert (whole[codes[~at_mass]] == (grid[~at_mass] == np.rint(grid[~at_mass]))).all()
        # Each fine cell's drawn values code back to it (whole numbers to the whole cell, the point masses).
        fine = np.repeat(np.arange(fine_cell_count(col)), 5)
        drawn = fine_cell_values(col, fine, np.random.default_rng(2))
        assert (fine_codes(col, drawn) == fine).all()
    # A point mass keeps its own fine cell, whole (500.00) or not (2.50), and no other cell draws it.
    assert fine_codes(MASSED, [500.0])[0] == fine_cell_count(MASSED) - 2


def test_the_whole_number_cells_change_no_cost():
    """Each row still counts in exactly one fine cell, so a replaced row moves a histogram by L2 sqrt 2 in
    either layout, and the shapes' rho is what the noise multiplier says, before and after."""
    table = heaped_at_whole_kilograms(3000, seed=1)
    other = table.copy()
    other.loc[0, "weight"] = 65.0 if table.loc[0, "weight"] != 65.0 else 120.3
    for whole_cells in (True, False):
        codes = fine_codes(KG, table["weight"].to_numpy(), whole_cells=whole_cells)
        assert codes.min() >= 0 and np.bincount(codes).sum() == len(table)
        a = np.bincount(codes, minlength=fine_cell_count(KG, whole_cells=whole_cells))
        b = np.bincount(
            fine_codes(KG, other["weight"].to_numpy(), whole_cells=whole_cells),
            minlength=fine_cell_count(KG, whole_cells=whole_cells),
        )
        assert np.linalg.norm(a - b) == pytest.approx(math.sqrt(2))
    sigma = shape_noise_multiplier(0.001, 1)
    shapes = measure_shapes(table, [KG], sigma, np.random.default_rng(0), 20)
    legacy = ColumnShapes({"weight": tuple(np.zeros(320))}, sigma, 20, whole_cells=False)
    assert shapes.whole_cells and shapes.rho() == legacy.rho() == pytest.approx(0.001, rel=1e-12)


def test_the_same_whole_number_cells_for_two_tables_that_differ_in_one_row():
    """The split comes from the bounds and decimals: a row moved from a whole number (a whole cell) to
    199.9 changes no other row's fine cell and no cell count."""
    table = heaped_at_whole_kilograms(2000, seed=2)
    table.loc[0, "weight"] = 65.0
    other = table.copy()
    other.loc[0, "weight"] = 199.9
    same = np.arange(1, len(table))
    assert (fine_codes(KG, table["weight"])[same] == fine_codes(KG, other["weight"])[same]).all()
    whole = fine_whole(KG)
    assert whole[fine_codes(KG, [65.0])[0]] and not whole[fine_codes(KG, [199.9])[0]]
    a = measure_shapes(table, [KG], 3.0, np.random.default_rng(7), 20)
    b = measure_shapes(other, [KG], 3.0, np.random.default_rng(7), 20)
    assert len(a.counts["weight"]) == len(b.counts["weight"]) == fine_cell_count(KG) == 20 * FINE_SPLIT + 166
    assert np.abs(np.subtract(a.counts["weight"], b.counts["weight"])).sum() <= 2


def test_a_decimal_column_heaped_at_whole_numbers_keeps_them_through_measure_and_decode():
    """Weights at whole kilograms in 90% of rows (12% at 65.0) keep their whole share and the heap when
    decoded from their coarse cells by the noisy fine histogram (noise std 49, mst-eps1's on Cardio);
    with the earlier layout only about one value in five was whole."""
    table = heaped_at_whole_kilograms(20000, seed=3)
    real = table["weight"].to_numpy()
    codes = cell_codes(KG, real)
    shapes = measure_shapes(table, [KG], 49.0 / math.sqrt(2), np.random.default_rng(4), 20)
    released = np.round(shapes.values(KG, codes, np.random.default_rng(5)), 1)
    assert (cell_codes(KG, released) == codes).all()
    assert abs(_whole_share(released) - _whole_share(real)) < 0.04
    assert abs(np.mean(released == 65.0) - np.mean(real == 65.0)) < 0.02
    # A truly continuous column at one decimal (a tenth of its values whole) gets few whole values back:
    # the whole cells are shrunk apart from the others, not towards one mean with them.
    smooth = pd.DataFrame({"weight": np.clip(np.round(np.random.default_rng(6).normal(75, 12, 20000), 1), 35, 200)})
    shapes = measure_shapes(smooth, [KG], 49.0 / math.sqrt(2), np.random.default_rng(4), 20)
    released = shapes.values(KG, cell_codes(KG, smooth["weight"]), np.random.default_rng(5))
    assert _whole_share(released) < _whole_share(smooth["weight"].to_numpy()) + 0.06


def test_whole_kilograms_survive_msts_fit_and_sampling(tmp_path):
    table = heaped_at_whole_kilograms(6000, seed=8)
    profile = _mst_profile(0.1)
    setting = profile.release_target()
    data = TableEncoder(WHOLE_PART).encode(table).astype(np.float32)
    generator = get("mst")
    plan = generator.plan(profile, setting)
    result = generator.fit(TrainingJob(profile, setting, WHOLE_PART, data, SECRET, tmp_path), tmp_path, plan)
    model = model_of(torch.load(tmp_path / "checkpoints" / result.ledger[-1]["generator"], weights_only=True))
    assert model.shapes is not None and model.shapes.whole_cells
    sample = model.sample(len(table), np.random.default_rng(0))
    assert abs(_whole_share(sample["weight"].to_numpy()) - _whole_share(table["weight"].to_numpy())) < 0.06
    assert abs((sample["weight"] == 65.0).mean() - (table["weight"] == 65.0).mean()) < 0.03


# The previous layout's decoding, computed with the code before whole-number cells (commit 697143d's
# binning.shaped_cell_values and shapes.denoised) on the inputs of the test below.
LEGACY_VALUES = [41.2, 41.4, 39.3, 37.3, 35.1, 38.5, 38.5, 35.0, 35.5, 42.8, 48.6, 45.0]
LEGACY_SUM = 23498.3
LEGACY_FINE = [35.3, 41.9, 48.6, 55.3, 62.3, 68.9, 75.6, 82.1, 89.0, 95.4, 102.1, 109.2, 115.5]


def test_shapes_released_before_whole_number_cells_decode_as_before():
    """A dict without "whole_cells" (and an MST model's metadata without it) is the earlier layout: 320
    sub-bins of Cardio's weight, decoded to exactly the values the earlier code gave."""
    counts = np.round(50 + 40 * np.sin(np.arange(320) / 7.0))
    counts[[60, 61, 62]] = [900.0, -30.0, 400.0]
    legacy = ColumnShapes.from_dict({"counts": {"weight": counts.tolist()}, "noise_multiplier": 30.0, "bins": 20})
    assert not legacy.whole_cells
    values = legacy.values(KG, np.repeat(np.arange(20), 10), np.random.default_rng(5))
    assert values[:12].tolist() == LEGACY_VALUES and float(values.sum()) == pytest.approx(LEGACY_SUM, abs=1e-6)
    fine = legacy.fine_values(KG, np.arange(0, 320, 13), np.random.default_rng(6))
    assert fine[:13].tolist() == LEGACY_FINE
    # The new layout says so in its dict, and round-trips.
    assert ColumnShapes.from_dict(legacy.to_dict()) == legacy
    current = measure_shapes(heaped_at_whole_kilograms(500, seed=1), [KG], 3.0, np.random.default_rng(1), 20)
    assert current.to_dict()["whole_cells"] is True and ColumnShapes.from_dict(current.to_dict()) == current
    with pytest.raises(ConfigError, match="whole_cells"):
        ColumnShapes.from_dict({**current.to_dict(), "whole_cells": "yes"})
    # An MST model saved without the key samples with the earlier layout.
    model = MSTModel.uniform((KG,), 20)
    model.shapes = ColumnShapes({"weight": tuple(counts)}, 30.0, 20, whole_cells=False)
    arrays, meta = model.to_arrays()
    del meta["shapes"]["whole_cells"]
    loaded = MSTModel.from_arrays(arrays, meta)
    assert loaded.shapes is not None and not loaded.shapes.whole_cells
    assert MSTModel.from_arrays(*current_model(current).to_arrays()).shapes == current


def current_model(shapes: ColumnShapes) -> MSTModel:
    model = MSTModel.uniform((KG,), 20)
    model.shapes = shapes
    return model


# ------------------------------------------------------------------------- the neighbours' denoiser


AGE = Column("age", "continuous", bounds=(17.0, 90.0), decimals=0)


def _within_cell_error(weights: np.ndarray, truth: np.ndarray, parents: np.ndarray) -> float:
    """Half the L1 distance of the shares inside each coarse cell, weighted by the cell's true rows:
    what a decode at the true coarse counts gets wrong through the shape alone."""
    error = 0.0
    for cell in np.unique(parents):
        at = parents == cell
        w, t = weights[at], truth[at]
        if t.sum() == 0:
            continue
        share = w / w.sum() if w.sum() > 0 else np.full(at.sum(), 1.0 / at.sum())
        error += 0.5 * t.sum() * np.abs(share - t / t.sum()).sum()
    return error / truth.sum()


def test_the_neighbours_denoiser_keeps_heaps_and_reads_a_smooth_column_better_than_each_cells_mean():
    """Ages heaped at 0 and 5 on a smooth slope (the heaped census shape) and a smooth wide column: at
    mst-eps1's shape noise (std 54), the neighbours' denoiser places rows inside their cells with less
    error than shrinking each cell towards its own mean, and a heap keeps its measured share."""
    parents = fine_parents(AGE)
    ages = np.arange(17, 91)
    smooth = 400.0 * np.exp(-(((ages - 38.0) / 14.0) ** 2))
    heaped = np.where(ages % 5 == 0, 5.0 * smooth, smooth)
    wide = fine_parents(WEIGHT)
    ramp = np.r_[np.linspace(30.0, 600.0, 40), np.linspace(600.0, 5.0, 280), 0.0]  # sub-bins, then the mass
    for truth, cells in ((heaped, parents), (smooth, parents), (ramp, wide)):
        old, new = [], []
        for seed in range(8):
            noisy = np.rint(truth + np.random.default_rng(seed).normal(0.0, 54.0, truth.size))
            old.append(_within_cell_error(denoised(noisy, cells, 54.0), truth, cells))
            new.append(_within_cell_error(neighbour_denoised(noisy, cells, 54.0), truth, cells))
        assert np.mean(new) < 0.9 * np.mean(old), (np.mean(new), np.mean(old))
    noisy = np.rint(heaped + np.random.default_rng(1).normal(0.0, 54.0, heaped.size))
    weights = neighbour_denoised(noisy, parents, 54.0)
    at_40 = np.flatnonzero(ages == 40)[0]
    cell = parents == parents[at_40]
    assert weights[at_40] == noisy[at_40]  # a heap is kept as measured
    assert weights[at_40] / weights[cell].sum() == pytest.approx(heaped[at_40] / heaped[cell].sum(), abs=0.06)
    # No noise, nothing to denoise: the counts themselves (clipped), as the cell-mean rule gives.
    assert np.array_equal(neighbour_denoised(noisy, parents, 0.0), np.clip(noisy, 0, None))


def test_a_sparse_tail_stays_flat_under_the_neighbours_denoiser():
    """A wide column whose sub-bins hold a few rows each, far below the noise (a capital gain's tail):
    the smooth level is shrunk to each cell's mean as the cell-mean rule does, so no slope is invented."""
    truth = np.r_[np.full(320, 3.0), 0.0]
    cells = fine_parents(WEIGHT)
    old, new = [], []
    for seed in range(8):
        noisy = np.rint(truth + np.random.default_rng(seed).normal(0.0, 54.0, truth.size))
        old.append(_within_cell_error(denoised(noisy, cells, 54.0), truth, cells))
        new.append(_within_cell_error(neighbour_denoised(noisy, cells, 54.0), truth, cells))
    assert np.mean(new) <= np.mean(old) + 0.01, (np.mean(new), np.mean(old))


def test_shapes_released_before_the_neighbours_denoiser_decode_as_before():
    """Shapes (and an MST model's metadata) without "denoiser" keep the cell-mean rule, so a released
    model's rows for a fixed seed do not move; new shapes say "neighbours" and round-trip."""
    counts = np.rint(200 + 150 * np.sin(np.arange(74) / 6.0))
    counts[[23, 28]] = [1400.0, 1300.0]
    raw = {"counts": {"age": counts.tolist()}, "noise_multiplier": 38.0, "bins": 20, "whole_cells": True}
    legacy = ColumnShapes.from_dict(raw)
    assert legacy.denoiser == CELL_MEAN
    assert np.array_equal(legacy.shape(AGE), denoised(counts, fine_parents(AGE), legacy.noise_std, fine_whole(AGE)))
    current = ColumnShapes({"age": tuple(counts)}, 38.0, 20)
    assert current.denoiser == NEIGHBOURS and current.to_dict()["denoiser"] == NEIGHBOURS
    assert ColumnShapes.from_dict(current.to_dict()) == current
    assert np.array_equal(current.shape(AGE), neighbour_denoised(counts, fine_parents(AGE), current.noise_std))
    with pytest.raises(ConfigError, match="denoiser"):
        ColumnShapes.from_dict({**current.to_dict(), "denoiser": "median"})
    model = MSTModel.uniform((AGE,), 20)
    model.shapes = current
    arrays, meta = model.to_arrays()
    assert MSTModel.from_arrays(arrays, meta).shapes == current
    del meta["shapes"]["denoiser"]
    loaded = MSTModel.from_arrays(arrays, meta)
    assert loaded.shapes is not None and loaded.shapes.denoiser == CELL_MEAN
    codes = np.repeat(np.arange(20), 30)
    assert np.array_equal(
        loaded.shapes.values(AGE, codes, np.random.default_rng(3)),
        shaped_cell_values(AGE, codes, denoised(counts, fine_parents(AGE), legacy.noise_std), np.random.default_rng(3)),
    )


def test_the_denoiser_changes_no_cost_and_reads_only_the_noisy_counts():
    """Decoding is post-processing: the same noisy counts, std and rho whichever rule reads them; two
    tables a row apart give shapes whose only difference is that row's count."""
    table = make_demo_table(CENSUS, 3000, seed=5, shape=SHAPES["heaped"])
    a = measure_shapes(table, [AGE], 30.0, np.random.default_rng(2), 20)
    b = measure_shapes(table.iloc[1:], [AGE], 30.0, np.random.default_rng(2), 20)
    diff = np.asarray(a.counts["age"]) - np.asarray(b.counts["age"])
    assert np.abs(diff).sum() == 1.0
    old = ColumnShapes(a.counts, a.noise_multiplier, a.bins, a.whole_cells, CELL_MEAN)
    assert a.rho() == old.rho() and a.noise_std == old.noise_std
    assert np.array_equal(a.shape(AGE), neighbour_denoised(np.asarray(a.counts["age"]), fine_parents(AGE), a.noise_std))


def test_the_running_median_is_each_windows_median_ends_included():
    """The neighbours' denoiser's running median, computed for the full windows at once, equals the median of
    each position's window (`half` either side, fewer at the ends) taken one at a time."""
    rng = np.random.default_rng(3)
    for length in (0, 1, 5, 16, 17, 18, 40, 640):
        for half in (0, 1, 8):
            for y in (rng.normal(size=length) * 50, np.round(rng.normal(size=length)), np.zeros(length)):
                windows = [np.median(y[max(i - half, 0) : i + half + 1]) for i in range(length)]
                assert np.array_equal(_running_median(y, half), np.array(windows, dtype=np.float64)), (length, half)


def test_a_shape_is_denoised_once_and_read_only():
    table = make_demo_table(CENSUS, 3000, seed=5, shape=SHAPES["heaped"])
    shapes = measure_shapes(table, [AGE], 30.0, np.random.default_rng(2), 20)
    first = shapes.shape(AGE)
    assert shapes.shape(AGE) is first and not first.flags.writeable
    assert np.array_equal(
        first, neighbour_denoised(np.asarray(shapes.counts["age"]), fine_parents(AGE), shapes.noise_std)
    )
    assert shapes == ColumnShapes(shapes.counts, shapes.noise_multiplier, shapes.bins)  # the cache is no field
