"""Reading and validating input tables: every bad input gives a readable error, no raw values leak."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import InvalidTableError, MissingInputError
from dpsynth.tasks.table_io import file_sha256, read_table, write_table
from dpsynth.tasks.validate import (
    TABLE,
    build_suite,
    check_table,
    load_suite,
    suite_to_json,
    validate_table,
    write_suite,
)

ROOT = Path(__file__).resolve().parents[2]
CARDIO_YAML = ROOT / "configs" / "cardio.yaml"
CARDIO_SUITE = ROOT / "expectations" / "cardio.json"
REAL_DATA = ROOT.parent / "shared" / "data" / "cardio_train.csv"

# Values that must never appear in a public report or an error message.
SECRET_TEXT = "secret-text-4711"
SECRET_LEVEL = 987654


@pytest.fixture(scope="module")
def schema() -> DatasetSchema:
    return DatasetSchema.from_yaml(CARDIO_YAML)


@pytest.fixture(scope="module")
def demo(schema) -> pd.DataFrame:
    return make_demo_table(schema, 300, seed=3)


def write_csv(df: pd.DataFrame, path: Path, sep: str = ";") -> Path:
    df.to_csv(path, sep=sep, index=False)
    return path


def assert_public(report_or_text) -> None:
    text = (
        report_or_text
        if isinstance(report_or_text, str)
        else (json.dumps(report_or_text.to_public_dict()) + report_or_text.summary_text())
    )
    assert SECRET_TEXT not in text
    assert str(SECRET_LEVEL) not in text


def check_fails(schema, df) -> InvalidTableError:
    with pytest.raises(InvalidTableError) as info:
        check_table(schema, df)
    assert_public(str(info.value))
    return info.value


# ------------------------------------------------------------------------------------ good inputs


def test_demo_table_passes_through_csv(schema, demo, tmp_path):
    path = write_csv(demo, tmp_path / "t.csv")
    df = read_table(path, schema)
    report = check_table(schema, df)
    assert report.passed and report.rows == len(demo)
    assert report.problems == [] and report.will_impute == {}
    assert report.dropped_columns == [] and report.warnings == []  # the id column goes silently
    assert "passed" in report.summary_text()
    assert df["weight"].dtype == np.float64 and df["age"].dtype == np.int64


def test_parquet_input_works(schema, demo, tmp_path):
    for name in ("t.parquet", "t.pq"):
        path = write_table(demo, tmp_path / name)
        df = read_table(path, schema)
        pd.testing.assert_frame_equal(df, demo)
        assert check_table(schema, df).passed
    # Parquet recognised by its magic bytes whatever the extension.
    sniffed = tmp_path / "t.data"
    sniffed.write_bytes((tmp_path / "t.parquet").read_bytes())
    assert check_table(schema, read_table(sniffed, schema)).passed


def test_write_table_csv_round_trip_with_separator(schema, demo, tmp_path):
    path = write_table(demo, tmp_path / "sub" / "t.csv", separator=schema.separator)
    df = read_table(path, schema)
    assert list(df.columns) == list(demo.columns)
    assert check_table(schema, df).passed
    assert len(file_sha256(path)) == 64 and file_sha256(path) == file_sha256(path)


def test_missing_and_out_of_bounds_feature_values_are_imputed_not_errors(schema, demo):
    df = demo.copy()
    df["ap_hi"] = df["ap_hi"].astype(float)
    df.loc[:4, "ap_hi"] = [-150, 16020, 1, np.nan, 500]  # 4 outside [60, 240], 1 missing
    df["gluc"] = df["gluc"].astype(float)
    df.loc[10:12, "gluc"] = np.nan
    report = check_table(schema, df)
    assert report.will_impute == {"ap_hi": 5, "gluc": 3}
    assert "ap_hi 5" in report.summary_text() and "will impute" in report.summary_text()


def test_unknown_extra_column_is_warned_and_dropped(schema, demo, tmp_path):
    df = demo.copy()
    df["notes"] = SECRET_TEXT
    report = check_table(schema, read_table(write_csv(df, tmp_path / "t.csv"), schema))
    assert report.passed
    assert report.dropped_columns == ["notes"]
    assert any("notes" in w and "dropped" in w for w in report.warnings)
    assert_public(report)


def test_string_levels_and_comma_separator(tmp_path):
    schema = DatasetSchema.from_dict(
        {
            "name": "toy",
            "target": "y",
            "columns": {
                "x": {"type": "continuous", "bounds": [0, 1], "decimals": 3},
                "z": {"type": "continuous", "bounds": [-5, 5], "decimals": 1},
                "colour": {"type": "categorical", "levels": ["red", "green", "blue"]},
                "y": {"type": "binary", "levels": ["no", "yes"]},
            },
        }
    )
    df = make_demo_table(schema, 50, seed=0)
    report = check_table(schema, read_table(write_csv(df, tmp_path / "t.csv", sep=","), schema))
    assert report.passed
    bad = df.copy()
    bad.loc[0, "colour"] = "purple"
    err = check_fails(schema, bad)
    assert "colour" in str(err) and "declared levels" in str(err)


# ----------------------------------------------------------------------------- unreadable inputs


def test_missing_file(schema, tmp_path):
    with pytest.raises(MissingInputError, match="does not exist"):
        read_table(tmp_path / "nope.csv", schema)
    with pytest.raises(MissingInputError, match="not a file"):
        read_table(tmp_path, schema)


def test_empty_file(schema, tmp_path):
    path = tmp_path / "empty.csv"
    path.write_bytes(b"")
    with pytest.raises(InvalidTableError, match=r"empty \(0 bytes\)"):
        read_table(path, schema)


def test_header_only(schema, demo, tmp_path):
    path = write_csv(demo.iloc[:0], tmp_path / "header.csv")
    with pytest.raises(InvalidTableError, match="header but no rows"):
        read_table(path, schema)
    with pytest.raises(InvalidTableError, match="header but no rows"):
        read_table(write_table(demo.iloc[:0], tmp_path / "header.parquet"), schema)


def test_wrong_separator(schema, demo, tmp_path):
    path = write_csv(demo, tmp_path / "comma.csv", sep=",")
    with pytest.raises(InvalidTableError) as info:
        read_table(path, schema)
    assert "seems to use ',' as separator but the schema declares ';'" in str(info.value)


def test_binary_file_is_not_a_table(schema, tmp_path):
    rng = np.random.default_rng(0)
    png = tmp_path / "image.csv"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + rng.bytes(2000))
    noise = tmp_path / "noise.csv"
    noise.write_bytes(bytes(range(128, 256)) * 40)  # no NUL byte, not UTF-8
    fake_parquet = tmp_path / "noise.parquet"
    fake_parquet.write_bytes(rng.bytes(5000))
    truncated = tmp_path / "truncated.csv"
    truncated.write_bytes(b"PAR1" + rng.bytes(100))
    for path, words in (
        (png, "binary file"),
        (noise, "not UTF-8"),
        (fake_parquet, "not a readable Parquet"),
        (truncated, "not a readable Parquet"),
    ):
        with pytest.raises(InvalidTableError, match=words) as info:
            read_table(path, schema)
        assert "Traceback" not in str(info.value)


def test_duplicated_column_name(schema, demo, tmp_path):
    path = tmp_path / "dup.csv"
    text = write_csv(demo, tmp_path / "t.csv").read_text()
    header, rest = text.split("\n", 1)
    path.write_text(header.replace("gluc", "age") + "\n" + rest)
    with pytest.raises(InvalidTableError, match="duplicated column names: 'age'"):
        read_table(path, schema)
    dup = demo.copy()
    dup.columns = [c if c != "gluc" else "age" for c in demo.columns]
    with pytest.raises(InvalidTableError, match="duplicated column names: 'age'"):
        validate_table(schema, dup)


def test_ragged_rows(schema, demo, tmp_path):
    path = write_csv(demo, tmp_path / "t.csv")
    path.write_text(path.read_text() + "1;2;3;4;5;6;7;8;9;10;11;12;13;14;15\n")
    with pytest.raises(InvalidTableError, match="cannot be parsed"):
        read_table(path, schema)


# ------------------------------------------------------------------------------- invalid contents


def test_required_column_missing(schema, demo):
    err = check_fails(schema, demo.drop(columns=["cholesterol"]))
    assert ("cholesterol", "required column is missing", len(demo)) in err.problems
    assert len(err.problems) == 1  # its other checks are not reported again
    assert "cholesterol" in str(err) and "required column is missing" in str(err)


def test_text_in_numeric_column(schema, demo, tmp_path):
    df = demo.copy().astype({"ap_lo": object})
    df.loc[[5, 9], "ap_lo"] = SECRET_TEXT
    table = read_table(write_csv(df, tmp_path / "t.csv"), schema)
    report = validate_table(schema, table)
    assert not report.passed
    assert report.problems == [("ap_lo", "values must be numbers", 2)]
    assert_public(report)
    assert SECRET_TEXT in json.dumps(report.internal_result)  # only the internal record has samples
    err = check_fails(schema, table)
    assert "ap_lo" in str(err) and "values must be numbers" in str(err)


def test_categorical_value_outside_levels(schema, demo):
    df = demo.copy()
    df.loc[[1, 2, 3], "cholesterol"] = SECRET_LEVEL
    err = check_fails(schema, df)
    assert err.problems == [("cholesterol", "categorical values must be one of the declared levels [1, 2, 3]", 3)]
    assert "cholesterol" in str(err) and "declared levels" in str(err)


def test_target_with_a_third_value(schema, demo):
    df = demo.copy()
    df.loc[7, "cardio"] = 2
    err = check_fails(schema, df)
    assert err.problems == [("cardio", "target values must be one of the declared levels [0, 1]", 1)]


def test_missing_target_values_are_errors(schema, demo):
    df = demo.copy().astype({"cardio": float})
    df.loc[[0, 1], "cardio"] = np.nan
    err = check_fails(schema, df)
    assert ("cardio", "target values must not be missing", 2) in err.problems


def test_all_missing_column(schema, demo, tmp_path):
    df = demo.copy().astype({"smoke": object})
    df["smoke"] = None
    table = read_table(write_csv(df, tmp_path / "t.csv"), schema)
    err = check_fails(schema, table)
    assert err.problems == [("smoke", "column is entirely missing", len(demo))]


def test_one_row_table(schema, demo, tmp_path):
    table = read_table(write_csv(demo.iloc[:1], tmp_path / "one.csv"), schema)
    err = check_fails(schema, table)
    assert err.problems[0][0] == TABLE and "at least 2" in err.problems[0][1]
    assert "1 row " in str(err)
    assert check_table(schema, demo.iloc[:2]).passed
    with pytest.raises(InvalidTableError, match="at least 10"):
        check_table(schema, demo.iloc[:5], min_rows=10)
    report = validate_table(schema, demo.iloc[:0])
    assert report.problems == [(TABLE, "the table has no rows", 0)]


def test_public_dict_holds_counts_only(schema, demo):
    df = demo.copy().astype({"height": object})
    df.loc[0, "height"] = SECRET_TEXT
    df.loc[1, "gluc"] = SECRET_LEVEL
    df.loc[2, "weight"] = 1234.5  # out of bounds: counted, never shown
    report = validate_table(schema, df)
    public = report.to_public_dict()
    assert set(public) == {
        "passed",
        "rows",
        "suite",
        "problems",
        "will_impute",
        "outside_bounds",
        "missing",
        "dropped_columns",
        "warnings",
    }
    text = json.dumps(public)
    assert "1234.5" not in text and "partial_unexpected" not in text and "unexpected_list" not in text
    assert_public(report)
    assert public["will_impute"]["weight"] == 1
    assert public["outside_bounds"] == {"weight": 1} and public["missing"] == {}
    assert report.repairs() == {"weight": {"outside_bounds": 1, "missing": 0, "imputed": 1}}
    assert {p["column"] for p in public["problems"]} == {"height", "gluc"}
    json.dumps(report.internal_result)  # JSON-able


# ------------------------------------------------------------------------------------------ suite


def test_committed_suite_matches_schema(schema, tmp_path):
    committed = json.loads(CARDIO_SUITE.read_text())
    fresh = json.loads(suite_to_json(schema))
    # A newer GX only changes the recorded version: regenerate with `python -m dpsynth.tasks.validate`.
    committed["meta"].pop("great_expectations_version")
    fresh["meta"].pop("great_expectations_version")
    assert committed == fresh, (
        "expectations/cardio.json is stale: python -m dpsynth.tasks.validate "
        "configs/cardio.yaml expectations/cardio.json"
    )
    written = write_suite(schema, tmp_path / "s.json")
    assert json.loads(written.read_text())["name"] == "cardio_v1"


def test_loaded_suite_validates_like_a_built_one(schema, demo):
    suite = load_suite(CARDIO_SUITE)
    assert len(suite.expectations) == len(build_suite(schema).expectations)
    df = demo.copy()
    df.loc[0, "gluc"] = 9
    assert validate_table(schema, df, suite=suite).problems == validate_table(schema, df).problems


def test_suite_covers_every_rule(schema):
    types = [e.expectation_type for e in build_suite(schema).expectations]
    for rule in (
        "expect_column_to_exist",
        "expect_column_values_to_be_in_type_list",
        "expect_column_values_to_be_between",
        "expect_column_values_to_be_in_set",
        "expect_table_row_count_to_be_between",
        "expect_column_values_to_not_be_null",
        "expect_column_proportion_of_non_null_values_to_be_between",
    ):
        assert rule in types
    assert types.count("expect_column_to_exist") == len(schema.columns)


# ------------------------------------------------------------------------------------- real file


@pytest.mark.skipif(not REAL_DATA.is_file(), reason="the Kaggle cardio table is not available here")
def test_real_cardio_file(schema):
    df = read_table(REAL_DATA, schema)
    start = time.perf_counter()
    report = check_table(schema, df)
    elapsed = time.perf_counter() - start
    assert report.rows == 70000 and report.passed
    assert {"ap_hi", "ap_lo", "height"} <= set(report.will_impute)
    assert all(n > 0 for n in report.will_impute.values())
    assert report.dropped_columns == []
    assert elapsed < 10
