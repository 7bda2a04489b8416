"""Algorithm 3's protocol around the selection solver: split sizes, stratification, fixed test split."""

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from dpsynth.models.config import EvaluationConfig, Profile
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.preprocessing import stratified_split, typed_frame
from dpsynth.models.privacy.release_choice import ValidationFacts, choice_scores, choice_sensitivity
from dpsynth.tasks.evaluate import (
    concordant_pairs,
    evaluate_synthetic,
    level_count_gap,
    level_share_columns,
    real_splits,
    synthetic_split,
)


def _encoded(cardio_schema, demo_frame):
    enc = TableEncoder(cardio_schema)
    table = typed_frame(cardio_schema, demo_frame[cardio_schema.column_names])
    encoded = enc.encode(table)
    y = (encoded[:, enc.target_index] > 0).astype(int)
    parts = stratified_split(y, (0.8, 0.1, 0.1), 0)
    split = {"rows": np.arange(len(y)), **parts}
    return enc, table, encoded, split, y


def test_honest_splits_keep_the_test_rows_fixed_and_reshuffle_train_val(cardio_schema, demo_frame):
    enc, _, encoded, split, y = _encoded(cardio_schema, demo_frame)
    first = real_splits(split, encoded, enc, "honest", 0, seed=0)
    later = real_splits(split, encoded, enc, "honest", 3, seed=0)
    assert np.array_equal(first["test"], split["test"]) and np.array_equal(later["test"], split["test"])
    assert len(later["train"]) == len(split["train"]) and len(later["val"]) == len(split["val"])
    assert not np.array_equal(later["val"], split["val"])
    assert not set(later["train"]) & set(split["test"])
    assert abs(y[later["val"]].mean() - y.mean()) < 0.02


def test_thesis_protocol_draws_a_fresh_test_split_per_index(cardio_schema, demo_frame):
    enc, _, encoded, split, _ = _encoded(cardio_schema, demo_frame)
    a = real_splits(split, encoded, enc, "thesis", 1, seed=0)
    b = real_splits(split, encoded, enc, "thesis", 2, seed=0)
    assert len(a["test"]) == len(split["test"]) and not np.array_equal(a["test"], b["test"])


def test_synthetic_run_uses_real_sizes_and_is_deterministic(tmp_path, cardio_schema, demo_frame):
    _, table, encoded, split, _ = _encoded(cardio_schema, demo_frame)
    synthetic = table.iloc[np.random.default_rng(0).permutation(len(table))[:2700]].reset_index(drop=True)
    path = tmp_path / "synthetic.parquet"
    synthetic.to_parquet(path)
    profile = Profile(name="t", evaluation=EvaluationConfig(n_regularisation_values=3))
    complete = np.ones(len(table), dtype=bool)
    one = evaluate_synthetic(cardio_schema, path, encoded, split, profile, index=0, complete=complete)
    two = evaluate_synthetic(cardio_schema, path, encoded, split, profile, index=0, complete=complete)
    assert {k: v for k, v in one.items() if k != "seconds"} == {k: v for k, v in two.items() if k != "seconds"}
    assert one["penalty"] in ("l1", "l2") and 0.5 < one["test_auc"] <= 1.0
    shares = {k: v for k, v in one.items() if k.startswith("share:cardio=")}
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    assert abs(shares["share:cardio=1"] - float((synthetic["cardio"] == 1).mean())) < 1e-12


def test_single_class_synthetic_data_is_degenerate_not_an_error(tmp_path, cardio_schema, demo_frame):
    _, table, encoded, split, _ = _encoded(cardio_schema, demo_frame)
    path = tmp_path / "collapsed.parquet"
    table.iloc[:2700].assign(cardio=1).to_parquet(path)
    complete = np.ones(len(table), dtype=bool)
    result = evaluate_synthetic(cardio_schema, path, encoded, split, Profile(name="t"), index=0, complete=complete)
    assert result["degenerate"] and result["test_auc"] == 0.5 and result["share:cardio=0"] == 0.0
    # A constant classifier ranks every validation pair as a tie: half of them count.
    y_val = encoded[split["val"], TableEncoder(cardio_schema).target_index] > 0
    assert result["real_val_pairs"] == 0.5 * y_val.sum() * (~y_val).sum()
    # The largest level-share gap to the real validation rows is the lost class's real share.
    real_share = float((table.iloc[split["val"]]["cardio"] == 0).mean())
    assert abs(result["real_val_share_gap"] - real_share) < 1e-12


def test_share_gap_is_small_for_rows_drawn_like_the_real_ones(tmp_path, cardio_schema, demo_frame):
    _, table, encoded, split, _ = _encoded(cardio_schema, demo_frame)
    path = tmp_path / "synthetic.parquet"
    table.iloc[np.concatenate([split["train"], split["val"]])].to_parquet(path)
    complete = np.ones(len(table), dtype=bool)
    result = evaluate_synthetic(cardio_schema, path, encoded, split, Profile(name="t"), index=0, complete=complete)
    assert 0.0 < result["real_val_share_gap"] < 0.06
    # The DP choice's gap, in rows, over the same (complete) validation rows.
    assert abs(result["real_val_gap_rows"] / len(split["val"]) - result["real_val_share_gap"]) < 1e-9


def test_synthetic_split_has_the_real_sizes_and_is_stratified():
    y = np.array([0] * 630 + [1] * 270)
    train, val = synthetic_split(y, 800, 100, seed=4)
    assert len(train) == 800 and len(val) == 100 and not set(train) & set(val)
    assert abs(y[val].mean() - 0.3) < 0.011 and abs(y[train].mean() - 0.3) < 0.011
    again = synthetic_split(y, 800, 100, seed=4)
    assert np.array_equal(train, again[0])


def test_concordant_pairs_is_the_auc_times_the_pairs():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 500)
    scores = np.round(rng.normal(size=500) + y, 1)  # rounded: many ties
    positives = y.sum()
    assert concordant_pairs(scores, y) == pytest.approx(roc_auc_score(y, scores) * positives * (500 - positives))
    assert concordant_pairs(scores, np.zeros(500, dtype=int)) == 0.0


def test_dp_choice_score_moves_at_most_its_sensitivity_when_one_row_is_replaced(cardio_schema, demo_frame):
    """The score of models/privacy/release_choice.py on the validation rows that needed no imputation, for a
    fixed classifier and synthetic shares: replacing any one validation row (its values, its label,
    whether it is complete) moves it by at most the sensitivity (4 + w) / n computed from n alone."""
    enc, table, encoded, _, y = _encoded(cardio_schema, demo_frame)
    rng = np.random.default_rng(0)
    n, w = 300, 1.0
    rows = rng.choice(len(table), n, replace=False)
    complete = rng.random(n) > 0.1
    coef = rng.normal(size=len(enc.feature_indices))
    shares = level_share_columns(cardio_schema, table.iloc[rng.choice(len(table), 2000)])

    def score(rows, complete):
        kept = rows[complete]
        x, target = encoded[kept][:, enc.feature_indices], y[kept]
        frame = enc.decode(encoded[kept])
        result = {
            "real_val_pairs": [concordant_pairs(x @ coef, target)],
            "real_val_gap_rows": [level_count_gap(cardio_schema, frame, shares)],
        }
        return float(choice_scores(pd.DataFrame(result), ValidationFacts(n, 0, 0), w)[0])

    base = score(rows, complete)
    bound = choice_sensitivity(n, w)
    worst = 0.0
    others = np.setdiff1d(np.arange(len(table)), rows)
    for _ in range(300):
        i = rng.integers(n)
        new_rows, new_complete = rows.copy(), complete.copy()
        new_rows[i] = rng.choice(others)
        new_complete[i] = rng.random() > 0.3
        worst = max(worst, abs(score(new_rows, new_complete) - base))
    assert 0 < worst <= bound
