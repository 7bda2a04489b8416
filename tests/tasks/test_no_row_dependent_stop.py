"""A publishing run never stops on a fact of its rows that epsilon does not cover (issue 39, point 1).

Whether the secret split leaves a target level without rows depends on the rows: with 2 rows of the
rarer level it always does, with 3 about 95% of the time. If either stopped the run, two tables one row
apart would stop with probabilities 1 and 0.95 (a delta of 0.05 whatever the epsilon). So the split,
model selection and the DP decision all complete, recording the missing level internally."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dpsynth.models.config import EvaluationConfig, Profile, Setting, load_profile
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.preprocessing import typed_frame
from dpsynth.models.privacy.secret import PrivacySecret, store
from dpsynth.tasks.decision import decide
from dpsynth.tasks.evaluate import complete_rows_path, evaluate_synthetic
from dpsynth.tasks.split import secret_split, split_stage
from tests.conftest import TEST_SECRET_HEX, publishing_smoke


def _rare_target(n_rows: int, rare: int) -> np.ndarray:
    """A 0/1 target with `rare` rows of level 1, spread over the table (Cardio's levels are 0 and 1, so
    the values are also the level codes `secret_split` takes)."""
    target = np.zeros(n_rows, dtype=np.int64)
    target[np.linspace(0, n_rows - 1, rare, dtype=np.int64)] = 1 if rare else 0
    return target


@pytest.mark.parametrize("rare", [0, 1, 2, 3])
def test_the_split_stage_completes_and_records_a_missing_level(tmp_path, cardio_schema, rare):
    profile = load_profile(publishing_smoke(tmp_path / "profile"))
    assert not profile.trial
    run_dir = tmp_path / "run"
    store(run_dir, PrivacySecret.from_hex(TEST_SECRET_HEX))
    table = tmp_path / "table.parquet"
    pd.DataFrame({cardio_schema.target: _rare_target(600, rare)}).to_parquet(table)

    done = split_stage(run_dir, cardio_schema, table, profile)

    split = dict(np.load(done["split"]))
    target = _rare_target(600, rare)
    missing = done.info["missing_target_levels"]
    assert missing == {name: ["1"] for name in ("train", "val", "test") if not target[split[name]].any()}
    assert rare == 3 or missing  # fewer than 3 rows of a level cannot fill three parts


def test_over_a_thousand_secrets_two_and_three_rare_rows_always_give_an_outcome(cardio_schema, tmp_path):
    profile = load_profile(publishing_smoke(tmp_path))
    targets = {rare: _rare_target(200, rare) for rare in (2, 3)}
    no_outcome = dict.fromkeys(targets, 0)
    lacking = dict.fromkeys(targets, 0)
    secrets = 1000
    for k in range(secrets):
        secret = PrivacySecret(k.to_bytes(16, "big"))
        for rare, target in targets.items():
            try:
                drawn = secret_split(cardio_schema, target, profile, secret)
            except Exception:  # noqa: BLE001  (any stop is the event under test)
                no_outcome[rare] += 1
                continue
            lacking[rare] += bool(drawn.missing_levels)
    assert no_outcome == {2: 0, 3: 0}
    # The event a stop would have revealed: always with 2 rows, about 95% of the time with 3 (1 - 6 x 0.8
    # x 0.1 x 0.1): one row apart, a stop on it would have had a delta of about 0.05.
    assert lacking[2] == secrets
    assert 0.9 < lacking[3] / secrets < 0.99


def test_selection_and_the_dp_decision_complete_when_validation_and_test_lack_a_level(
    tmp_path, cardio_schema, demo_frame
):
    """One positive row in training, none in validation or test: every selection run and the DP choice
    and approval complete; no concordant pair counts (P = 0) and the internal AUCs are NaN."""
    encoder = TableEncoder(cardio_schema)
    table = typed_frame(cardio_schema, demo_frame[cardio_schema.column_names]).iloc[:1200].copy()
    table[cardio_schema.target] = 0
    table.loc[5, cardio_schema.target] = 1
    encoded = encoder.encode(table).astype(np.float32)
    draws = PrivacySecret.from_hex(TEST_SECRET_HEX).numpy("t").random(len(table))
    rows = np.arange(len(table))
    split = {"rows": rows, "train": rows[(draws < 0.8) | (rows == 5)]}
    split["val"] = rows[(draws >= 0.8) & (draws < 0.9) & (rows != 5)]
    split["test"] = rows[(draws >= 0.9) & (rows != 5)]
    complete = np.ones(len(table), dtype=bool)
    np.save(tmp_path / "encoded.npy", encoded)
    np.save(complete_rows_path(tmp_path / "encoded.npy"), complete)
    np.savez(tmp_path / "split.npz", **split)

    profile = Profile(name="t", evaluation=EvaluationConfig(n_regularisation_values=3, min_release_auc=0.6))
    records = []
    for index, seed in enumerate((1, 2)):
        synthetic = demo_frame[cardio_schema.column_names].sample(1200, random_state=seed, replace=True)
        path = tmp_path / f"synthetic_{index}.parquet"
        typed_frame(cardio_schema, synthetic.reset_index(drop=True)).to_parquet(path)
        # index 1: the real baseline's reshuffle of train + validation, with one positive row in the pool
        record = evaluate_synthetic(cardio_schema, path, encoded, split, profile, index=index, complete=complete)
        records.append({"setting": "k10", "iteration": 10 * (index + 1), "epsilon": 1.0, **record})
    results = pd.DataFrame.from_records(records)
    assert (results["real_val_pairs"] == 0.0).all()
    assert results["test_auc"].isna().all() and results["real_val_auc"].isna().all()

    choice = decide(
        results,
        [{"iteration": 10, "epsilon": 0.5}, {"iteration": 20, "epsilon": 1.0}],
        profile,
        Setting("k10", 10),
        release=True,
        schema=cardio_schema,
        encoded_path=tmp_path / "encoded.npy",
        split_path=tmp_path / "split.npz",
        secret=PrivacySecret.from_hex(TEST_SECRET_HEX),
    )
    assert choice is not None and choice.release is not None
    assert choice.iteration in (10, 20) and math.isnan(choice.test_auc)
    assert choice.release.epsilon_choice == pytest.approx(
        profile.privacy.choice_epsilon + profile.privacy.approval_epsilon
    )
