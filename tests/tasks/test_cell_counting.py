"""The marginal generators' one counting pass (tasks/cell_counting.py): row group by row group, in this
process or on a local 2-worker Dask cluster, the counts are those of the whole training matrix, and the
noisy marginals a release publishes for a secret are the same either way; its memory does not grow with
the rows."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch

from dpsynth.models.config import load_profile
from dpsynth.models.data.cell_counts import CellCounts, count_frame, one_and_two_way
from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators.mst.fit import measure, measure_counts
from dpsynth.models.privacy.secret import PrivacySecret, store
from dpsynth.tasks import training
from dpsynth.tasks.cell_counting import count_training_cells, read_rows, write_public_training_matrix
from tests.conftest import ROOT

CENSUS = ROOT / "configs" / "census-demo.yaml"
SECRET = PrivacySecret(bytes(range(32)))


@pytest.fixture(scope="module")
def schema() -> DatasetSchema:
    return DatasetSchema.from_yaml(CENSUS)


@pytest.fixture(scope="module")
def table(schema) -> pd.DataFrame:
    """A census-shape table with invalid values (out of bounds, unknown levels) and missing ones."""
    frame = make_demo_table(schema, 3000, seed=5)
    frame.loc[::7, "age"] = 400  # out of bounds: invalid, so missing, so the middle of the bounds
    frame.loc[::11, "hours_per_week"] = np.nan
    frame["workclass"] = frame["workclass"].astype(object)
    frame.loc[::13, "workclass"] = "astronaut"
    return frame


@pytest.fixture(scope="module")
def parquet(tmp_path_factory, table) -> str:
    path = tmp_path_factory.mktemp("counting") / "table.parquet"
    table.to_parquet(path, index=False, row_group_size=700)  # five row groups, the last one short
    return str(path)


def _matrix_counts(schema, table, rows, bins, cliques, fine) -> CellCounts:
    """The counts of the in-memory path: the whole training matrix, decoded (what MST and AIM read before)."""
    profile = load_profile("mst-eps1", CENSUS)
    matrix = training.training_matrix(schema, table, rows, None, profile, np.zeros(0))
    decoded = TableEncoder(schema).decode(matrix)
    return count_frame(decoded, tuple(schema.columns), bins, cliques, fine)


def test_row_group_counts_equal_the_whole_matrix_counts(schema, table, parquet):
    rows = np.sort(np.random.default_rng(0).choice(len(table), 2100, replace=False))
    cliques, fine = one_and_two_way(len(schema.columns)), [0, 5]
    counted = count_training_cells(schema, parquet, rows, 5, 16, cliques, fine)
    assert counted.total == len(rows)
    assert counted.digest() == _matrix_counts(schema, table, rows, 16, cliques, fine).digest()


def test_the_training_matrix_written_by_row_groups_is_the_in_memory_one(schema, table, parquet, tmp_path):
    """The DP-SGD generators' training rows (no row imputes another) written one row group at a time:
    the same float32 array as encoding the whole table in memory, in the order of the rows asked for."""
    rows = np.random.default_rng(1).permutation(len(table))[:2200]  # every row group, not in order
    profile = load_profile("eps1", CENSUS)
    write_public_training_matrix(schema, parquet, rows, profile.knn_neighbors, tmp_path / "train_rows.npy")
    written = np.load(tmp_path / "train_rows.npy")
    expected = training.training_matrix(schema, table, rows, None, profile, np.zeros(0))
    assert written.dtype == np.float32 and written.shape == expected.shape
    assert np.array_equal(written, expected)


def test_counts_on_a_local_dask_cluster_give_the_same_noisy_marginals(schema, table, parquet):
    from distributed import LocalCluster

    rows = np.arange(0, len(table), 2)
    cliques = one_and_two_way(len(schema.columns))
    here = count_training_cells(schema, parquet, rows, 5, 16, cliques)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        there = count_training_cells(schema, parquet, rows, 5, 16, cliques, cluster=cluster.scheduler_address)
    assert there.digest() == here.digest()
    columns = tuple(schema.columns)
    # The noise is drawn after the counts, from the secret: the released measurements are the same bits,
    # and the same as MST's measurement of the decoded training matrix in memory.
    decoded = TableEncoder(schema).decode(
        training.training_matrix(schema, table, rows, None, load_profile("mst-eps1", CENSUS), np.zeros(0))
    )
    released = [measure_counts(there, columns, 0.5, SECRET.numpy, 16), measure(decoded, columns, 0.5, SECRET.numpy, 16)]
    assert released[0].tree == released[1].tree
    for first, second in zip(released[0].one_way, released[1].one_way, strict=True):
        assert np.array_equal(first.y, second.y) and np.array_equal(first.mapping, second.mapping)
    for (pair, y), (other_pair, other_y) in zip(released[0].two_way, released[1].two_way, strict=True):
        assert pair == other_pair and np.array_equal(y, other_y)


def _stage_inputs(folder, schema, table):
    folder.mkdir(parents=True)
    path = folder / "table.parquet"
    table.to_parquet(path, index=False, row_group_size=1000)
    np.save(folder / "encoded.npy", np.zeros((len(table), TableEncoder(schema).width), dtype=np.float32))
    np.save(folder / "gan_rows.npy", np.arange(0, len(table), 3))
    return path, folder / "encoded.npy", folder / "gan_rows.npy"


@pytest.mark.parametrize("generator", ["mst", "aim"])
def test_prepare_and_train_stages_release_the_same_model_with_the_counting_on_a_cluster(
    schema, table, tmp_path, generator
):
    """The stages a release runs: the prepare stage counts (no training matrix) and the fitted checkpoint
    is the same file content whether the counting ran here or on the cluster's two workers."""
    from distributed import LocalCluster

    profile = load_profile(f"{generator}-eps1", CENSUS)
    section = profile.sections[generator]
    # Few estimator iterations (post-processing: the counts and the noise are what is compared); rho stays.
    small = {"iterations": 50, **({"round_iterations": 10, "rounds": 20} if generator == "aim" else {})}
    profile = dataclasses.replace(profile, **{generator: section.replace(**small)})
    setting = profile.release_target()
    models = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        for name, address in (("here", None), ("cluster", cluster.scheduler_address)):
            run_dir = tmp_path / name
            run_dir.mkdir(mode=0o700)
            store(run_dir, SECRET)
            inputs = _stage_inputs(run_dir / "inputs", schema, table)
            prepared = training.prepare_stage(run_dir, schema, *inputs, profile, setting, cluster=address)
            assert not (prepared.directory / "train_rows.npy").exists()
            assert CellCounts.load(prepared["cell_counts"]).total == len(np.arange(0, len(table), 3))
            trained = training.train_stage(run_dir, schema, prepared.directory, profile, setting)
            last = json.loads((trained["ledger"]).read_text())["checkpoints"][-1]
            models.append(torch.load(trained["checkpoints"] / last["generator"], weights_only=True)["model"])
    here, there = models
    assert here["meta"] == there["meta"]
    assert here["arrays"].keys() == there["arrays"].keys()
    for key in here["arrays"]:
        assert torch.equal(here["arrays"][key], there["arrays"][key])


MEMORY_CHILD = textwrap.dedent(
    """
    import json, resource, sys
    import numpy as np
    from dpsynth.models.data.cell_counts import one_and_two_way
    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.tasks.cell_counting import count_training_cells, read_rows, write_public_training_matrix
    schema = DatasetSchema.from_yaml(sys.argv[1])
    rows = np.arange(int(sys.argv[3]))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    counts = count_training_cells(schema, sys.argv[2], rows, 5, 32, one_and_two_way(len(schema.columns)))
    print(json.dumps({"before": before, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "total": counts.total}))
    """
)

# What the counting pass may grow by from a table to one 4 times longer (kB of peak resident memory):
# the row indices (8 bytes a row) and allocator noise (measured: 4 MB). Counting the whole table in memory
# grows by about 2.6 kB a row (measured: 155 MB more for these 60,000 extra rows).
MEMORY_BUFFER_KB = 8_000


def test_the_counting_pass_peak_memory_does_not_grow_with_the_rows(schema, tmp_path):
    small = make_demo_table(schema, 20_000, seed=1)
    peaks = {}
    for copies in (1, 4):
        path = tmp_path / f"table{copies}.parquet"
        pd.concat([small] * copies, ignore_index=True).to_parquet(path, index=False, row_group_size=5_000)
        done = subprocess.run(
            [sys.executable, "-c", MEMORY_CHILD, str(CENSUS), str(path), str(len(small) * copies)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["total"] == len(small) * copies
        peaks[copies] = result["peak"]
    assert peaks[4] - peaks[1] < MEMORY_BUFFER_KB, peaks


def test_read_rows_reads_the_rows_of_the_whole_table_one_row_group_at_a_time(table, parquet):
    rows = np.array([0, 1, 699, 700, 1403, 2999])  # across row groups, the last row too
    whole = pd.read_parquet(parquet).iloc[rows]
    pd.testing.assert_frame_equal(read_rows(parquet, rows), whole.set_axis(rows))
    assert read_rows(parquet, np.zeros(0, dtype=np.int64)).columns.tolist() == whole.columns.tolist()
