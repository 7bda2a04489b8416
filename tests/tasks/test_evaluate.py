"""Algorithm 3's protocol around the selection solver: split sizes, stratification, fixed test split."""

import numpy as np

from models.config import EvaluationConfig, Profile
from models.encoding import TableEncoder
from models.preprocessing import stratified_split, typed_frame
from tasks.evaluate import evaluate_synthetic, real_splits, synthetic_split


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
    one = evaluate_synthetic(cardio_schema, path, encoded, split, profile, index=0)
    two = evaluate_synthetic(cardio_schema, path, encoded, split, profile, index=0)
    assert {k: v for k, v in one.items() if k != "seconds"} == {k: v for k, v in two.items() if k != "seconds"}
    assert one["penalty"] in ("l1", "l2") and 0.5 < one["test_auc"] <= 1.0
    shares = {k: v for k, v in one.items() if k.startswith("share:cardio=")}
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    assert abs(shares["share:cardio=1"] - float((synthetic["cardio"] == 1).mean())) < 1e-12


def test_single_class_synthetic_data_is_degenerate_not_an_error(tmp_path, cardio_schema, demo_frame):
    _, table, encoded, split, _ = _encoded(cardio_schema, demo_frame)
    path = tmp_path / "collapsed.parquet"
    table.iloc[:2700].assign(cardio=1).to_parquet(path)
    result = evaluate_synthetic(cardio_schema, path, encoded, split, Profile(name="t"), index=0)
    assert result["degenerate"] and result["test_auc"] == 0.5 and result["share:cardio=0"] == 0.0
    # The largest level-share gap to the real validation rows is the lost class's real share.
    real_share = float((table.iloc[split["val"]]["cardio"] == 0).mean())
    assert abs(result["real_val_share_gap"] - real_share) < 1e-12


def test_share_gap_is_small_for_rows_drawn_like_the_real_ones(tmp_path, cardio_schema, demo_frame):
    _, table, encoded, split, _ = _encoded(cardio_schema, demo_frame)
    path = tmp_path / "synthetic.parquet"
    table.iloc[np.concatenate([split["train"], split["val"]])].to_parquet(path)
    result = evaluate_synthetic(cardio_schema, path, encoded, split, Profile(name="t"), index=0)
    assert 0.0 < result["real_val_share_gap"] < 0.06




def test_synthetic_split_has_the_real_sizes_and_is_stratified():
    y = np.array([0] * 630 + [1] * 270)
    train, val = synthetic_split(y, 800, 100, seed=4)
    assert len(train) == 800 and len(val) == 100 and not set(train) & set(val)
    assert abs(y[val].mean() - 0.3) < 0.011 and abs(y[train].mean() - 0.3) < 0.011
    again = synthetic_split(y, 800, 100, seed=4)
    assert np.array_equal(train, again[0])
