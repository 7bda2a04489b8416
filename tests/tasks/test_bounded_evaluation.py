"""Evaluation against real rows reads at most EVALUATION_ROWS rows of each part (tasks/split.py): on a
larger table a row-local subsample drawn from the secret, the generator still training on every training
row; a table whose parts fit is split and evaluated exactly as before."""

from __future__ import annotations

import numpy as np

from dpsynth.models.config import load_profile
from dpsynth.models.data.preprocessing import row_local_split
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.privacy.secret import PrivacySecret
from dpsynth.tasks import split as split_mod
from dpsynth.tasks.evaluate import synthetic_rows
from dpsynth.tasks.preprocess import gan_rows, imputation_scopes
from tests.conftest import ROOT

CENSUS = ROOT / "configs" / "census-demo.yaml"
SECRET = PrivacySecret(bytes(range(32)))


def _split(n_rows: int):
    schema = DatasetSchema.from_yaml(CENSUS)
    profile = load_profile("mst-eps1", CENSUS)
    target_codes = np.arange(n_rows) % 2  # the target's first and second levels, in turn
    return profile, split_mod.secret_split(schema, target_codes, profile, SECRET)


def test_a_table_whose_parts_fit_is_split_and_evaluated_on_every_row(monkeypatch):
    monkeypatch.setattr(split_mod, "EVALUATION_ROWS", 400)
    profile, drawn = _split(450)  # every part under 400 rows
    assert drawn.evaluation_train is None
    expected = row_local_split(450, profile.split, SECRET)
    for name in ("train", "val", "test"):
        assert np.array_equal(drawn.parts[name], expected[name])


def test_a_large_table_is_evaluated_on_a_bounded_secret_subsample_and_trains_on_every_row(monkeypatch):
    monkeypatch.setattr(split_mod, "EVALUATION_ROWS", 60)
    profile, drawn = _split(1000)
    full = row_local_split(1000, profile.split, SECRET)
    assert np.array_equal(drawn.parts["train"], full["train"])  # the generator's rows: all of them
    split = {**drawn.parts, "rows": drawn.rows, "eval_train": drawn.evaluation_train}
    assert np.array_equal(gan_rows(split, profile.protocol), full["train"])
    for name, part in (("train", drawn.evaluation_train), ("val", drawn.parts["val"]), ("test", drawn.parts["test"])):
        assert len(part) == 60 and set(part) <= set(full[name]) and np.all(np.diff(part) > 0)
    assert [len(s) for s in imputation_scopes(split, profile.protocol)] == [60, 60, 60]
    assert synthetic_rows(profile, split) == 120
    # Drawn from the secret: the same again, another with another secret.
    again = _split(1000)[1]
    assert np.array_equal(again.evaluation_train, drawn.evaluation_train)
    other = split_mod.secret_split(
        DatasetSchema.from_yaml(CENSUS), np.full(1000, -1), profile, PrivacySecret(bytes(32))
    ).evaluation_train
    assert other is not None and not np.array_equal(other, drawn.evaluation_train)


def test_a_stage_reads_only_the_split_parts_it_uses(tmp_path, monkeypatch):
    """Evaluation reads the bounded parts; the table-sized `rows` and `train` stay on disk (SplitFile)."""
    path = tmp_path / "split.npz"
    parts = {"rows": np.arange(1000), "train": np.arange(800), "val": np.arange(800, 900), "test": np.arange(900, 1000)}
    np.savez(path, eval_train=np.arange(0, 800, 10), **parts)
    read = []
    npz = np.lib.npyio.NpzFile
    original = npz.__getitem__

    def spied(self, key):
        read.append(key)
        return original(self, key)

    monkeypatch.setattr(npz, "__getitem__", spied)
    split = split_mod.SplitFile(path)
    assert set(split) == {"rows", "train", "val", "test", "eval_train"} and len(split) == 5
    assert synthetic_rows(load_profile("mst-eps1", CENSUS), split) == 80 + 100
    assert np.array_equal(split["test"], parts["test"])
    assert np.array_equal(split["val"], parts["val"]) and np.array_equal(split["val"], parts["val"])
    assert sorted(read) == ["eval_train", "test", "val"]  # each part read once, the others never


def test_the_target_codes_are_read_one_row_group_at_a_time_as_from_the_whole_column(tmp_path):
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dpsynth.models.data.encoding import level_codes

    schema = DatasetSchema.from_yaml(CENSUS)
    column = schema.column(schema.target)
    values = [column.levels[i % len(column.levels)] for i in range(2_500)]
    values[7] = "not a level"
    path = tmp_path / "table.parquet"
    pq.write_table(pa.table({schema.target: values}), path, row_group_size=1_000)
    assert pq.ParquetFile(path).num_row_groups == 3
    codes = split_mod.target_level_codes(schema, path)
    assert codes.dtype == np.int32 and codes[7] == -1
    assert np.array_equal(codes, level_codes(column, pd.Series(values)))
