"""The release bundle: its files, its epsilon ledger, and the check that no real row is in it (its
dictionary, datapackage.json, summary page and checksums: tests/tasks/test_bundle_files.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.pyfunc import load_generator_file, sample_table
from dpsynth.tasks.bundle import bundle_contains_no_real_rows, real_row_matches, write_bundle
from tests.conftest import CARDIO_SCHEMA
from tests.tasks.test_public_release import make_release
from tests.tasks.test_registry import make_generator_file


@pytest.fixture
def release(tmp_path, cardio_schema):
    gen_file = make_generator_file(tmp_path / "ckpt" / "generator_000020.pt", cardio_schema, epsilon=3.5, seed=0)
    gen, _ = load_generator_file(gen_file)
    synthetic = sample_table(gen, TableEncoder(cardio_schema), 500, seed=11)
    notes = tmp_path / "notes.md"
    notes.write_text("# Release notes\n\nepsilon 3.5 at delta 1e-5.\n")
    record = make_release(cardio_schema, rows=len(synthetic))
    return {"generator": gen_file, "synthetic": synthetic, "notes": notes, "record": record}


def write(tmp_path, release, cardio_schema, name="bundle", **options):
    return write_bundle(
        tmp_path / name,
        release["record"],
        synthetic_frame=release["synthetic"],
        generator_file=release["generator"],
        release_notes_path=release["notes"],
        schema_path=CARDIO_SCHEMA,
        **options,
    )


def test_bundle_holds_table_generator_ledger_and_notes(tmp_path, release, cardio_schema, demo_frame):
    paths = write(tmp_path, release, cardio_schema)
    bundle = paths["bundle"]
    assert sorted(p.name for p in bundle.iterdir()) == [
        "DATA_DICTIONARY.md",
        "RELEASE_NOTES.md",
        "SHA256SUMS",
        "SUMMARY.html",
        "datapackage.json",
        "generator.pt",
        "release.json",
        "schema.yaml",
        "synthetic.csv",
        "synthetic.parquet",
    ]
    pd.testing.assert_frame_equal(pd.read_parquet(paths["parquet"]), release["synthetic"])
    # Commas, although the schema reads its input with semicolons (its release_separator is the default).
    pd.testing.assert_frame_equal(pd.read_csv(paths["csv"], sep=","), release["synthetic"])
    assert paths["generator"].read_bytes() == release["generator"].read_bytes()
    blob_keys = set(load_generator_file(paths["generator"])[1])
    # No critic, no optimiser state (a file may also record its format: models/generators/samplers.py).
    assert (
        {"spec", "iteration", "epsilon", "delta"}
        <= blob_keys
        <= {"spec", "iteration", "epsilon", "delta", "format_version"}
    )

    ledger = json.loads(paths["release_json"].read_text())
    # The release costs training to the LAST checkpoint (40) with the choice, not the chosen one's 3.5.
    assert ledger["chosen_checkpoint"] == {"iteration": 20, "epsilon": 3.5} and ledger["epsilon"] == 5.25
    assert ledger["epsilon_parts"] == {
        "training_to_last_checkpoint": 5.25,
        "last_checkpoint": 40,
        "checkpoint_choice_and_approval": 1.0,
        "composition": "parallel",
    }
    assert [c["iteration"] for c in ledger["checkpoints"]] == [0, 20, 40]
    assert all(set(c) == {"iteration", "epsilon"} for c in ledger["checkpoints"])
    record = release["record"]
    assert ledger["delta"] == 1e-5 and ledger["accountant"]["parameters"]["K"] == record.parameters["K"] == 1000
    assert ledger["synthetic_rows"] == 500 and ledger["files"] == {"synthetic.csv": {"separator": ","}}
    assert ledger["epsilon_covers"] == record.statement.covers
    assert ledger["epsilon_does_not_cover"] == list(record.statement.does_not_cover)
    assert paths["release_notes"].read_text().startswith("# Release notes")

    # `demo_frame` stands in for the real table: the generator's rows are not copies of it.
    assert bundle_contains_no_real_rows(bundle, demo_frame) == []


def test_real_row_checker_catches_an_inserted_real_row(tmp_path, release, cardio_schema, demo_frame):
    paths = write(tmp_path, release, cardio_schema)
    real = demo_frame[cardio_schema.column_names]
    leaked = pd.concat([release["synthetic"], real.iloc[[123]]], ignore_index=True)
    leaked.to_csv(paths["csv"], sep=",", index=False)  # the bundle's CSV separator
    assert bundle_contains_no_real_rows(paths["bundle"], real) == [paths["csv"]]

    # In any table file, at any depth, in either format, with any usual separator.
    (paths["bundle"] / "extra").mkdir()
    real.sample(3, random_state=0).to_parquet(paths["bundle"] / "extra" / "rows.parquet", index=False)
    real.sample(3, random_state=1).to_csv(paths["bundle"] / "extra" / "rows.csv", sep=";", index=False)
    found = bundle_contains_no_real_rows(paths["bundle"], real)
    expected = [paths["csv"], paths["bundle"] / "extra" / "rows.parquet", paths["bundle"] / "extra" / "rows.csv"]
    assert sorted(found) == sorted(expected)


def test_rows_are_compared_whole(demo_frame, cardio_schema):
    real = demo_frame[cardio_schema.column_names].head(50)
    assert real_row_matches(real.iloc[[5]], real) == 1
    near = real.iloc[[5]].copy()
    near["weight"] = near["weight"] + 0.1  # same discrete values, one continuous value off
    assert real_row_matches(near, real) == 0
    assert real_row_matches(real.drop(columns=["age"]), real) == 0  # cannot hold a complete real row
    as_text = real.iloc[[7]].astype(str)  # a CSV read back as text still matches
    assert real_row_matches(as_text, real) == 1


def test_rewriting_replaces_the_bundle_and_refuses_other_rows(tmp_path, release, cardio_schema):
    paths = write(tmp_path, release, cardio_schema)
    (paths["bundle"] / "stale.csv").write_text("a,b\n1,2\n")
    again = write(tmp_path, release, cardio_schema)
    assert not (again["bundle"] / "stale.csv").exists()
    assert not list(tmp_path.glob("bundle.*"))  # no staging folders left behind

    # The bundle publishes the record's rows, no more and no fewer.
    with pytest.raises(ValueError, match="500 synthetic rows"):
        write_bundle(
            tmp_path / "other",
            release["record"],
            synthetic_frame=release["synthetic"].head(499),
            generator_file=release["generator"],
            release_notes_path=release["notes"],
        )
    (tmp_path / "not-a-bundle").mkdir()
    (tmp_path / "not-a-bundle" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        write(tmp_path, release, cardio_schema, name="not-a-bundle")
