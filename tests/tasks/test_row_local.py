"""Changing one row of the table moves no other row: the split, the critic subsets and the imputed
values outside that row's subset stay where they were (the privacy argument "a row reaches one
critic only", docs/privacy.md section 2). Runs the real stages on a generated table, twice, with one shared secret."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpsynth.models.config import Profile, Setting
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.gswgan.partition import subset_sizes
from dpsynth.models.privacy.secret import PrivacySecret, store
from dpsynth.tasks.preprocess import preprocess_stage
from dpsynth.tasks.split import split_stage
from dpsynth.tasks.training import prepare_stage
from dpsynth.tasks.validate import validate_stage
from tests.conftest import CARDIO_SCHEMA, TEST_SECRET_HEX

K = 12
PROFILE = Profile(
    name="rowlocal",
    settings=(Setting("k12", K),),
    gan=GanConfig(pretrain_iterations=1, iterations=2, checkpoint_every=1),
)


def _table_with_gaps(demo_frame) -> pd.DataFrame:
    table = demo_frame.copy()
    rng = np.random.default_rng(4)
    for column, bad in (("ap_hi", 900), ("height", 20), ("weight", np.nan), ("cholesterol", np.nan)):
        rows = rng.choice(len(table), 120, replace=False)
        table[column] = table[column].astype(object)
        table.loc[rows, column] = bad
    return table


def _run(tmp_path, name: str, table: pd.DataFrame, cardio_schema) -> dict:
    run_dir = tmp_path / name
    store(run_dir, PrivacySecret.from_hex(TEST_SECRET_HEX))
    data = tmp_path / f"{name}.csv"
    table.to_csv(data, sep=cardio_schema.separator, index=False)
    validated = validate_stage(run_dir, CARDIO_SCHEMA, data)
    split = split_stage(run_dir, cardio_schema, validated["table"], PROFILE)
    prep = preprocess_stage(run_dir, cardio_schema, validated["table"], split["split"], PROFILE)
    pre = prepare_stage(
        run_dir, cardio_schema, validated["table"], prep["encoded"], prep["gan_rows"], PROFILE, PROFILE.settings[0]
    )
    gan_rows = np.load(prep["gan_rows"])
    partition = np.load(pre["partition"])
    subset_of = np.full(len(table), -1)
    for k in range(K):
        subset_of[gan_rows[partition[k][partition[k] >= 0]]] = k
    return {
        "split": dict(np.load(split["split"])),
        "encoded": np.load(prep["encoded"]),
        "complete": np.load(prep["complete"]),
        "gan_rows": gan_rows,
        "subset_of": subset_of,
        "train_rows": np.load(pre["train_rows"]),
        "sizes": subset_sizes(partition),
    }


@pytest.mark.parametrize("where", ["train", "val"])
def test_changing_one_row_moves_no_other_row(tmp_path, cardio_schema, demo_frame, where):
    table = _table_with_gaps(demo_frame)
    before = _run(tmp_path, "a", table, cardio_schema)
    r = int(before["split"][where][7])
    changed = table.copy()
    changed.loc[r, "cardio"] = 1 - int(changed.loc[r, "cardio"])  # its label flipped
    changed.loc[r, "ap_hi"] = 5000  # an invalid value: now imputed
    changed.loc[r, "weight"] = 180.0
    after = _run(tmp_path, "b", changed, cardio_schema)

    # Every row keeps its split (the changed one too: its split is a function of its index).
    for part in ("train", "val", "test"):
        assert np.array_equal(before["split"][part], after["split"][part])
    # Every training row keeps its critic subset.
    assert np.array_equal(before["subset_of"], after["subset_of"])
    assert np.array_equal(before["gan_rows"], after["gan_rows"])
    assert before["sizes"].max() - before["sizes"].min() <= 1

    # The generator's training rows: imputed values change inside the changed row's subset at most.
    position = {row: i for i, row in enumerate(before["gan_rows"])}
    own = before["subset_of"][r]
    outside = [position[row] for row in before["gan_rows"] if before["subset_of"][row] != own or own < 0]
    assert len(outside) > 0.8 * len(before["gan_rows"])
    assert np.array_equal(before["train_rows"][outside], after["train_rows"][outside])
    if where == "val":
        assert np.array_equal(before["train_rows"], after["train_rows"])  # a validation row trains nothing
    else:
        assert not np.array_equal(before["train_rows"][position[r]], after["train_rows"][position[r]])
    # Imputed rows exist, in other subsets too (the check above is not vacuous).
    incomplete = [position[row] for row in before["gan_rows"] if not before["complete"][row]]
    assert len(set(before["subset_of"][before["gan_rows"][incomplete]])) > 3

    # Evaluation encodings: rows of the other splits are untouched; the DP choice's validation rows (those
    # that needed no imputation) are untouched except the changed row itself.
    other_splits = np.concatenate([before["split"][p] for p in ("train", "val", "test") if p != where])
    assert np.array_equal(before["encoded"][other_splits], after["encoded"][other_splits])
    choice_rows = [row for row in before["split"]["val"] if before["complete"][row] and row != r]
    assert np.array_equal(before["encoded"][choice_rows], after["encoded"][choice_rows])
    assert before["complete"][r] != after["complete"][r] or not before["complete"][r]
