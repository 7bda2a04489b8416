"""The release bundle: its files, its epsilon ledger, and the check that no real row is in it."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from dpsynth.models.config import load_profile
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.privacy.statement import privacy_statement
from dpsynth.models.pyfunc import load_generator_file, sample_table
from dpsynth.tasks.bundle import (
    build_release_json,
    bundle_contains_no_real_rows,
    real_row_matches,
    write_bundle,
)
from tests.conftest import CARDIO_SCHEMA
from tests.tasks.test_registry import make_generator_file

PROFILE = load_profile("default", CARDIO_SCHEMA)
STATEMENT = privacy_statement(PROFILE, PROFILE.release_target(), release=True)
LEDGER = [{"iteration": 0, "epsilon": 0.0, "generator": "generator_000000.pt"},
          {"iteration": 20, "epsilon": 3.5, "generator": "generator_000020.pt", "level_shares": {"gender": {}}},
          {"iteration": 40, "epsilon": 5.25, "generator": "generator_000040.pt"}]


@pytest.fixture
def release(tmp_path, cardio_schema):
    gen_file = make_generator_file(tmp_path / "ckpt" / "generator_000020.pt", cardio_schema, epsilon=3.5, seed=0)
    gen, _ = load_generator_file(gen_file)
    synthetic = sample_table(gen, TableEncoder(cardio_schema), 500, seed=11)
    notes = tmp_path / "notes.md"
    notes.write_text("# Release notes\n\nepsilon 3.5 at delta 1e-5.\n")
    ledger = build_release_json(release_id="cardio-test", dataset="cardio", schema_version=1, ledger=LEDGER,
                                chosen_iteration=20, epsilon=5.25, epsilon_training=5.25, epsilon_choice=1.0,
                                composition="parallel", delta=1e-5, accountant="subsampled Gaussian",
                                parameters={"K": 10, "T": 40, "batch_size": 32, "sigma": 1.07, "C": 1.0},
                                epsilon_budget=10.0, rows=len(synthetic), statement=STATEMENT.as_dict(),
                                model_uri="models:/cardio-gswgan/1")
    return {"generator": gen_file, "synthetic": synthetic, "notes": notes, "release_json": ledger}


def write(tmp_path, release, cardio_schema, name="bundle"):
    return write_bundle(tmp_path / name, synthetic_frame=release["synthetic"], generator_file=release["generator"],
                        release_json=release["release_json"], release_notes_path=release["notes"],
                        schema_path=CARDIO_SCHEMA, separator=cardio_schema.separator)


def test_bundle_holds_table_generator_ledger_and_notes(tmp_path, release, cardio_schema, demo_frame):
    paths = write(tmp_path, release, cardio_schema)
    bundle = paths["bundle"]
    assert sorted(p.name for p in bundle.iterdir()) == ["RELEASE_NOTES.md", "generator.pt", "release.json",
                                                        "schema.yaml", "synthetic.csv", "synthetic.parquet"]
    pd.testing.assert_frame_equal(pd.read_parquet(paths["parquet"]), release["synthetic"])
    assert len(pd.read_csv(paths["csv"], sep=cardio_schema.separator)) == 500
    assert paths["generator"].read_bytes() == release["generator"].read_bytes()
    blob_keys = set(load_generator_file(paths["generator"])[1])
    assert blob_keys == {"spec", "iteration", "epsilon", "delta"}  # no critic, no optimiser state

    ledger = json.loads(paths["release_json"].read_text())
    # The release costs training to the LAST checkpoint (40) with the choice, not the chosen one's 3.5.
    assert ledger["chosen_checkpoint"] == {"iteration": 20, "epsilon": 3.5} and ledger["epsilon"] == 5.25
    assert ledger["epsilon_parts"] == {"training_to_last_checkpoint": 5.25, "last_checkpoint": 40,
                                       "checkpoint_choice_and_approval": 1.0, "composition": "parallel"}
    assert [c["iteration"] for c in ledger["checkpoints"]] == [0, 20, 40]
    assert all(set(c) == {"iteration", "epsilon"} for c in ledger["checkpoints"])
    assert ledger["delta"] == 1e-5 and ledger["accountant"]["parameters"]["K"] == 10
    assert ledger["epsilon_covers"] == STATEMENT.covers
    assert ledger["epsilon_does_not_cover"] == list(STATEMENT.does_not_cover)
    assert paths["release_notes"].read_text().startswith("# Release notes")

    # `demo_frame` stands in for the real table: the generator's rows are not copies of it.
    assert bundle_contains_no_real_rows(bundle, demo_frame) == []


def test_real_row_checker_catches_an_inserted_real_row(tmp_path, release, cardio_schema, demo_frame):
    paths = write(tmp_path, release, cardio_schema)
    real = demo_frame[cardio_schema.column_names]
    leaked = pd.concat([release["synthetic"], real.iloc[[123]]], ignore_index=True)
    leaked.to_csv(paths["csv"], sep=cardio_schema.separator, index=False)
    assert bundle_contains_no_real_rows(paths["bundle"], real) == [paths["csv"]]

    # In any table file, at any depth, in either format.
    (paths["bundle"] / "extra").mkdir()
    real.sample(3, random_state=0).to_parquet(paths["bundle"] / "extra" / "rows.parquet", index=False)
    found = bundle_contains_no_real_rows(paths["bundle"], real)
    assert sorted(found) == sorted([paths["csv"], paths["bundle"] / "extra" / "rows.parquet"])


def test_rows_are_compared_whole(demo_frame, cardio_schema):
    real = demo_frame[cardio_schema.column_names].head(50)
    assert real_row_matches(real.iloc[[5]], real) == 1
    near = real.iloc[[5]].copy()
    near["weight"] = near["weight"] + 0.1  # same discrete values, one continuous value off
    assert real_row_matches(near, real) == 0
    assert real_row_matches(real.drop(columns=["age"]), real) == 0  # cannot hold a complete real row
    as_text = real.iloc[[7]].astype(str)  # a CSV read back as text still matches
    assert real_row_matches(as_text, real) == 1


def test_rewriting_replaces_the_bundle_and_keeps_out_real_data_facts(tmp_path, release, cardio_schema):
    paths = write(tmp_path, release, cardio_schema)
    (paths["bundle"] / "stale.csv").write_text("a,b\n1,2\n")
    again = write(tmp_path, release, cardio_schema)
    assert not (again["bundle"] / "stale.csv").exists()
    assert not list(tmp_path.glob("bundle.*"))  # no staging folders left behind

    for key in ("real_auc", "critic_loss", "validation"):
        with pytest.raises(ValueError, match=key):
            write_bundle(tmp_path / "other", synthetic_frame=release["synthetic"],
                         generator_file=release["generator"], release_json={**release["release_json"], key: 1},
                         release_notes_path=release["notes"])
    (tmp_path / "not-a-bundle").mkdir()
    (tmp_path / "not-a-bundle" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        write(tmp_path, release, cardio_schema, name="not-a-bundle")


def test_non_private_epsilon_is_null_in_json():
    ledger = [{"iteration": 0, "epsilon": math.inf}, {"iteration": 10, "epsilon": math.inf}]
    common = {"release_id": "r", "dataset": "cardio", "schema_version": 1, "ledger": ledger, "epsilon": math.inf,
              "epsilon_training": math.inf, "epsilon_choice": 1.0, "composition": "non-private training",
              "delta": 1e-5, "accountant": "none", "parameters": {}, "epsilon_budget": None, "rows": 5,
              "statement": STATEMENT.as_dict()}
    out = build_release_json(chosen_iteration=10, **common)
    assert out["epsilon"] is None and out["private"] is False
    json.dumps(out, allow_nan=False)
    with pytest.raises(ValueError):
        build_release_json(chosen_iteration=7, **common)
