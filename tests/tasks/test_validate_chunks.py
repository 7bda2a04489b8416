"""Validation one chunk at a time (tasks/suite_results.py): the same verdicts, problems and counts as the
suite on the whole table, a validated Parquet file equal to the whole frame's, and a peak memory that
does not grow with the rows."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import great_expectations.expectations as gxe
import numpy as np
import pandas as pd
import pytest

from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.errors import ConfigError
from dpsynth.tasks.table_io import iter_table, read_table
from dpsynth.tasks.validate import (
    build_suite,
    conform_table,
    validate_chunks,
    validate_table,
    write_conformed_parquet,
)
from tests.conftest import ROOT

CHUNK = 100


def _both(schema, path, min_rows: int = 2, chunk: int = CHUNK):
    whole = validate_table(schema, read_table(path, schema), min_rows=min_rows)
    chunked = validate_chunks(schema, iter_table(path, schema, chunk), min_rows=min_rows)
    return whole, chunked


def _assert_same(whole, chunked) -> None:
    assert chunked.to_public_dict() == whole.to_public_dict()
    assert chunked.summary_text() == whole.summary_text()


def _problem_table(demo: pd.DataFrame) -> pd.DataFrame:
    """Known problems, each in some chunks only: text among numbers, values outside the levels and the
    bounds, missing targets and features, a column missing in one whole chunk."""
    df = demo.copy().astype({"ap_lo": object, "cardio": float, "smoke": float, "height": float})
    df.loc[[5, 250], "ap_lo"] = "text-in-a-number"
    df.loc[[1, 2, 310], "cholesterol"] = 987654
    df.loc[[7, 8], "cardio"] = np.nan
    df.loc[120:199, "smoke"] = np.nan  # the whole second chunk
    df.loc[[3, 260, 261], "height"] = 10_000.0  # outside the public bounds: imputed
    df.loc[[4, 150], "weight"] = np.nan
    return df


def test_a_table_with_known_problems_gets_the_same_failures_whole_and_in_chunks(cardio_schema, tmp_path):
    df = _problem_table(make_demo_table(cardio_schema, 340, seed=4))
    for name in ("t.csv", "t.parquet"):
        path = tmp_path / name
        if name.endswith(".csv"):
            df.to_csv(path, sep=cardio_schema.separator, index=False)
        else:
            df.astype({"ap_lo": str}).to_parquet(path, index=False)
        whole, chunked = _both(cardio_schema, path)
        assert not whole.passed
        assert {p[0] for p in whole.problems} == {"ap_lo", "cholesterol", "cardio"}
        assert whole.will_impute["smoke"] == 80 and whole.outside_bounds["height"] == 3
        _assert_same(whole, chunked)
        assert chunked.internal_result["statistics"] == whole.internal_result["statistics"]


def test_a_passing_table_and_the_table_wide_checks_judge_the_totals(cardio_schema, tmp_path):
    df = make_demo_table(cardio_schema, 250, seed=5).astype({"weight": float})
    df.loc[[10, 220], "weight"] = np.nan  # float chunks beside int chunks
    path = tmp_path / "t.csv"
    df.to_csv(path, sep=cardio_schema.separator, index=False)
    whole, chunked = _both(cardio_schema, path)
    assert whole.passed
    _assert_same(whole, chunked)
    # A last chunk of 50 rows alone has too few rows for a floor of 200, the table has enough.
    _assert_same(*_both(cardio_schema, path, min_rows=200))
    too_few = _both(cardio_schema, path, min_rows=251)
    assert not too_few[0].passed
    _assert_same(*too_few)
    # A column missing in every chunk is entirely missing in the table.
    df["smoke"] = np.nan
    df.to_csv(path, sep=cardio_schema.separator, index=False)
    gone = _both(cardio_schema, path)
    assert ("smoke", "column is entirely missing", 250) in gone[0].problems
    _assert_same(*gone)


def test_the_validated_parquet_equals_the_whole_conformed_frame(cardio_schema, tmp_path):
    df = make_demo_table(cardio_schema, 250, seed=6).astype({"weight": float, "gluc": float})
    df.loc[[10, 220], "weight"] = np.nan
    df.loc[[130], "gluc"] = np.nan  # a discrete column: int64 chunks beside a float one
    df["extra"] = 1
    path = tmp_path / "t.csv"
    df.to_csv(path, sep=cardio_schema.separator, index=False)
    report = validate_chunks(cardio_schema, iter_table(path, cardio_schema, CHUNK))
    written = write_conformed_parquet(cardio_schema, path, report, tmp_path / "table.parquet")
    whole, _, _ = conform_table(cardio_schema, read_table(path, cardio_schema))
    pd.testing.assert_frame_equal(pd.read_parquet(written), whole)


def test_an_expectation_that_cannot_be_combined_over_chunks_is_refused(cardio_schema, tmp_path):
    suite = build_suite(cardio_schema)
    suite.add_expectation(gxe.ExpectColumnValuesToBeUnique(column="age"))
    path = tmp_path / "t.csv"
    make_demo_table(cardio_schema, 150, seed=7).to_csv(path, sep=cardio_schema.separator, index=False)
    with pytest.raises(ConfigError, match="expect_column_values_to_be_unique"):
        validate_chunks(cardio_schema, iter_table(path, cardio_schema, CHUNK), suite=suite)


MEMORY_CHILD = textwrap.dedent(
    """
    import json, resource, sys
    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.tasks.table_io import iter_table
    from dpsynth.tasks.validate import validate_chunks
    schema = DatasetSchema.from_yaml(sys.argv[1])
    report = validate_chunks(schema, iter_table(sys.argv[2], schema, 5_000))
    print(json.dumps({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "rows": report.rows,
                      "passed": report.passed}))
    """
)

# What validation may grow by from a table to one 4 times longer (kB of peak resident memory): the
# per-chunk results' counters and allocator noise (measured: 4 MB). Validating the whole table in memory
# grows by about 2 kB a row (measured: 122 MB more for these 60,000 extra rows).
MEMORY_BUFFER_KB = 20_000


def test_validation_peak_memory_does_not_grow_with_the_rows(tmp_path):
    from dpsynth.models.data.schema import DatasetSchema

    census = ROOT / "configs" / "census-demo.yaml"
    schema = DatasetSchema.from_yaml(census)
    small = make_demo_table(schema, 20_000, seed=1)
    peaks = {}
    for copies in (1, 4):
        path = tmp_path / f"table{copies}.csv"
        pd.concat([small] * copies, ignore_index=True).to_csv(path, sep=schema.separator, index=False)
        done = subprocess.run(
            [sys.executable, "-c", MEMORY_CHILD, str(census), str(path)], check=True, capture_output=True, text=True
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["rows"] == len(small) * copies and result["passed"]
        peaks[copies] = result["peak"]
    assert peaks[4] - peaks[1] < MEMORY_BUFFER_KB, peaks
