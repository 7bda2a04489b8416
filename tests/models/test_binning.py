"""Cells on public facts: bins of the bounds plus declared point masses, and values that code back to
their own cell."""

import dataclasses

import numpy as np
import pytest

from dpsynth.models.data.binning import cell_codes, cell_count, cell_labels, cell_values
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError
from tests.conftest import CARDIO_SCHEMA, ROOT


def test_a_point_mass_has_its_own_cell_and_bins_cover_the_bounds(cardio_schema):
    col = dataclasses.replace(cardio_schema.column("height"), bounds=(0.0, 200.0), point_masses=(0.0,))
    codes = cell_codes(col, np.array([0.0, 0.5, 10.0, 199.9, 200.0, 250.0, np.nan]))
    assert codes.tolist() == [20, 0, 1, 19, 19, 19, -1]
    assert cell_count(col) == 21 and cell_labels(col)[-1] == "=0" and cell_labels(col)[19] == "[190, 200]"


@pytest.mark.parametrize("schema_path", [CARDIO_SCHEMA, ROOT / "configs" / "census-demo.yaml"])
def test_drawn_values_code_back_to_their_cell_with_masses_at_either_bound(schema_path):
    rng = np.random.default_rng(0)
    for col in DatasetSchema.from_yaml(schema_path).continuous:
        low, high = col.bounds
        for masses in [(), (low,), (high,), (low, high)]:
            masked = dataclasses.replace(col, point_masses=masses)
            codes = np.repeat(np.arange(cell_count(masked)), 50)
            assert (cell_codes(masked, cell_values(masked, codes, rng)) == codes).all(), (col.name, masses)


def test_point_masses_are_declared_on_continuous_columns_within_bounds():
    def schema(column: dict) -> dict:
        return {"name": "t", "target": "y", "columns": {"x": column, "y": {"type": "binary", "levels": [0, 1]}}}

    ok = DatasetSchema.from_dict(schema({"type": "continuous", "bounds": [0, 10], "point_masses": [0, 10]}))
    assert ok.column("x").point_masses == (0.0, 10.0)
    for column, fragment in [
        ({"type": "continuous", "bounds": [0, 10], "point_masses": [11]}, "within the bounds"),
        ({"type": "continuous", "bounds": [0, 10], "point_masses": [1, 1]}, "distinct"),
        ({"type": "binary", "levels": [0, 1], "point_masses": [0]}, "only continuous"),
    ]:
        with pytest.raises(ConfigError, match=fragment):
            DatasetSchema.from_dict(schema(column))


def test_drawn_values_stay_on_the_decimal_grid_where_the_bin_has_grid_values(cardio_schema):
    rng = np.random.default_rng(1)
    for bounds, decimals in [((0.0, 1.0), 2), ((35.0, 200.0), 1), ((1.0, 16.0), 0)]:
        col = dataclasses.replace(cardio_schema.column("weight"), bounds=bounds, decimals=decimals)
        codes = np.repeat(np.arange(cell_count(col)), 200)
        values = cell_values(col, codes, rng)
        assert (cell_codes(col, values) == codes).all(), bounds
        on_grid = np.isclose(values, np.round(values, decimals), rtol=0, atol=1e-9)
        # Only a bin narrower than one grid step (as [3.25, 4) of an integer column) takes its midpoint.
        width = (bounds[1] - bounds[0]) / 20
        assert on_grid.all() if width >= 10.0**-decimals else on_grid.mean() > 0.5, bounds
