"""The calibration re-places every row of a shaped column inside its cell by the measured fine histogram
(models/marginals/calibration.py `_placed_by_rank`): a heap the generator spread over its cell comes back
as one repeated value, the generator's order inside a cell is kept, and only released counts are read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth.models.data.binning import cell_codes, cell_values
from dpsynth.models.data.demo import SHAPES, make_demo_table
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators.samplers import sample_rows
from dpsynth.models.marginals.calibration import calibrate
from dpsynth.models.marginals.measure import MeasuredMarginals, measure, plan_for_rho
from dpsynth.models.privacy.secret import PrivacySecret

SECRET = PrivacySecret.from_hex("4d" * 32)
CENSUS = DatasetSchema.from_yaml(Path(__file__).resolve().parents[2] / "configs" / "census-demo.yaml")
HOURS = CENSUS.column("hours_per_week")
AGE = CENSUS.column("age")


@pytest.fixture(scope="module")
def heaped() -> pd.DataFrame:
    return make_demo_table(CENSUS, 6000, seed=5, shape=SHAPES["heaped"])


@pytest.fixture(scope="module")
def measured(heaped) -> MeasuredMarginals:
    return measure(heaped, CENSUS, plan_for_rho(CENSUS, 1.0, shape_share=0.2), SECRET)


def _spread_in_cells(table: pd.DataFrame, seed: int) -> pd.DataFrame:
    """A generator's table that has every row in the right cell but its own shape inside the cell:
    hours and ages drawn uniformly within their cells (the heap at 40 hours becomes a plateau)."""
    rng = np.random.default_rng(seed)
    out = table.copy()
    for col in (HOURS, AGE):
        out[col.name] = cell_values(col, cell_codes(col, table[col.name].to_numpy()), rng).astype(np.int64)
    return out


class _TableSampler:
    """A generator whose samples are rows of a fixed table (encoded), carrying measured marginals as a
    released generator file does: the GAN generators' sampling path without training one."""

    def __init__(self, table: pd.DataFrame, measured: MeasuredMarginals, oversample: int) -> None:
        self.encoded = TableEncoder(CENSUS).encode(table)
        self.marginals, self.oversample = measured, oversample

    def sample(self, n_rows: int, seed: int) -> np.ndarray:
        return self.encoded[np.random.default_rng(seed).integers(0, len(self.encoded), n_rows)]


def test_a_heaped_value_survives_a_calibrated_gans_sampling(heaped, measured):
    """Every row already in its measured cell, so the value updates move few rows: the heap at 40 hours
    and the ages ending in 0 or 5 come back only if every row is placed by the measured shape."""
    real_heap, real_round = (heaped["hours_per_week"] == 40).mean(), (heaped["age"] % 5 == 0).mean()
    spread = _spread_in_cells(heaped, 1)
    assert (spread["hours_per_week"] == 40).mean() < real_heap - 0.3  # the generator's plateau
    sampler = _TableSampler(spread, measured, oversample=3)
    out = sample_rows(sampler, TableEncoder(CENSUS), len(heaped), seed=9)
    assert abs((out["hours_per_week"] == 40).mean() - real_heap) < 0.03
    assert abs((out["age"] % 5 == 0).mean() - real_round) < 0.05
    # The same sampling again gives the same rows: the placement's randomness is the seed's.
    pd.testing.assert_frame_equal(out, sample_rows(sampler, TableEncoder(CENSUS), len(heaped), seed=9))


def test_the_generators_order_inside_a_cell_is_kept(heaped, measured):
    """Rows that stay in their cell keep their order by the generator's value (ties aside), while their
    values move to where the measured histogram puts them."""
    synthetic = _spread_in_cells(heaped, 2)
    synthetic["source_row"] = np.arange(len(synthetic))  # not a schema column: carried through as it is
    out = calibrate(synthetic, CENSUS, measured, np.random.default_rng(4))
    before = synthetic["hours_per_week"].to_numpy()[out["source_row"].to_numpy()]
    after = out["hours_per_week"].to_numpy()
    stayed = cell_codes(HOURS, before) == cell_codes(HOURS, after)
    assert stayed.mean() > 0.9
    assert (before[stayed] != after[stayed]).mean() > 0.3  # placed anew, not left where the generator put them
    for cell in np.unique(cell_codes(HOURS, after[stayed])):
        inside = stayed & (cell_codes(HOURS, after) == cell)
        order = np.lexsort((after[inside], before[inside]))
        assert (np.diff(after[inside][order]) >= 0).all(), f"cell {cell}: a lower generator value placed higher"


def test_the_placement_reads_only_the_released_counts(heaped, measured):
    """The calibration's output is a function of the synthetic rows, the noisy counts as released (a JSON
    round trip: no state beside them) and its random generator; the cells are the plan's, from the schema
    alone (the same for any two real tables)."""
    synthetic = _spread_in_cells(heaped, 3)
    first = calibrate(synthetic, CENSUS, measured, np.random.default_rng(6))
    released = MeasuredMarginals.from_dict(json.loads(json.dumps(measured.to_dict())))
    pd.testing.assert_frame_equal(first, calibrate(synthetic.copy(), CENSUS, released, np.random.default_rng(6)))
    assert not first.equals(calibrate(synthetic, CENSUS, released, np.random.default_rng(7)))
    assert plan_for_rho(CENSUS, 1.0, shape_share=0.2) == measured.plan


def test_placed_values_stay_in_their_cells_on_the_grid_and_point_masses_exact():
    """The placement changes no row's cell: on a schema with a point mass, bins holding no integer (1-16
    in 20 bins) and wide bins split in sub-bins, the 1-way counts stay at the calibration's targets and every
    value is in bounds, on the decimal grid and exactly the point mass where its cell is one."""
    schema = DatasetSchema.from_dict(
        {
            "name": "small",
            "target": "target",
            "columns": {
                "hours": {"type": "continuous", "bounds": [1, 99], "decimals": 0},
                "gain": {"type": "continuous", "bounds": [0, 10000], "decimals": 0, "point_masses": [0]},
                "schooling": {"type": "continuous", "bounds": [1, 16], "decimals": 0},
                "ratio": {"type": "continuous", "bounds": [0, 50], "decimals": 2},
                "target": {"type": "binary", "levels": [0, 1]},
            },
        }
    )
    real = make_demo_table(schema, 3000, seed=1, shape=SHAPES["hard"])
    with_shapes = measure(real, schema, plan_for_rho(schema, 20.0, shape_share=0.2), SECRET)
    synthetic = make_demo_table(schema, 3000, seed=2, shape=SHAPES["hard"])
    out = calibrate(synthetic, schema, with_shapes, np.random.default_rng(0))
    without = calibrate(
        synthetic,
        schema,
        MeasuredMarginals(with_shapes.marginals, with_shapes.total, with_shapes.plan, 20),
        np.random.default_rng(0),
    )
    for col in schema.columns:
        if not col.is_continuous:
            continue
        values = out[col.name].to_numpy(np.float64)
        low, high = col.continuous_bounds
        assert ((values >= low) & (values <= high)).all()
        assert np.allclose(values, np.round(values, col.decimals))
        codes = cell_codes(col, values)
        assert (np.bincount(codes, minlength=22) == np.bincount(cell_codes(col, without[col.name]), minlength=22)).all()
    gain = out["gain"].to_numpy()
    assert ((cell_codes(schema.column("gain"), gain) == 20) == (gain == 0)).all() and (gain == 0).any()
