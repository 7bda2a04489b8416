"""GS-WGAN's pretraining chunks as tasks on a local 2-worker Dask cluster (tasks/cluster.py): each chunk
ships only its own subsets' rows and draws from its own seeded stream, so the critics are the same bits
as pretraining in this process, and the prepare stage's critics file is the same with `cluster`."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from dpsynth.models.config import load_profile
from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.gswgan.partition import make_partition
from dpsynth.models.generators.gswgan.pretraining import chunk_rows, pretrain_critics
from dpsynth.models.privacy.secret import PrivacySecret, store
from dpsynth.tasks import training
from dpsynth.tasks.cluster import ClusterMap
from tests.conftest import ROOT

CENSUS = ROOT / "configs" / "census-demo.yaml"
SECRET = PrivacySecret(bytes(range(32)))
CPU = torch.device("cpu")


@pytest.fixture
def cluster():
    """A fresh cluster per test: what ran on it is that test's."""
    from distributed import LocalCluster

    threads = torch.get_num_threads()
    # In-process workers: a chunk task sets torch's thread count of the process it runs in to one.
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as local:
        yield local.scheduler_address
    torch.set_num_threads(threads)


def test_a_chunk_reads_the_same_rows_through_its_own_copy():
    data = torch.arange(30, dtype=torch.float32).reshape(10, 3)
    part = torch.as_tensor(make_partition(10, 4, SECRET))[1:3]  # sizes 3 and 2: one padded
    rows, local = chunk_rows(data, part)
    assert rows.shape[0] == part.numel() < data.shape[0]
    assert torch.equal(local < 0, part < 0)
    members = part >= 0
    assert torch.equal(rows[local[members]], data[part[members]])


def test_pretraining_on_a_local_dask_cluster_gives_the_same_critics(cluster):
    g = torch.Generator().manual_seed(3)
    data = torch.rand(700, 12, generator=g) * 2 - 1
    partition = make_partition(700, 7, SECRET)  # uneven subsets, chunks of 3: the last chunk holds one
    gan = GanConfig(pretrain_iterations=3)
    here = pretrain_critics(data, partition, gan, [], 11, CPU, chunk_size=3, workers=1)
    seen: list[int] = []
    there = pretrain_critics(
        data, partition, gan, [], 11, CPU, chunk_size=3, task_map=ClusterMap(cluster), progress=seen.append
    )
    assert len(here.params) == len(there.params)
    for mine, theirs in zip(here.params, there.params, strict=True):
        assert torch.equal(mine, theirs)
    assert seen and seen[-1] == 3
    # The workers did train: the critics differ from another seed's.
    other = pretrain_critics(data, partition, gan, [], 12, CPU, chunk_size=3, workers=1)
    assert not torch.equal(other.params[0], here.params[0])


def test_the_gswgan_prepare_stage_writes_the_same_critics_with_the_cluster(cluster, tmp_path):
    schema = DatasetSchema.from_yaml(CENSUS)
    table: pd.DataFrame = make_demo_table(schema, 1200, seed=4)
    profile = load_profile("smoke", CENSUS)
    setting = profile.release_target()
    assert training.generator_for(profile, setting).name == "gswgan"
    critics = []
    for name, address in (("here", None), ("cluster", cluster)):
        run_dir = tmp_path / name
        (run_dir / "inputs").mkdir(parents=True)
        run_dir.chmod(0o700)
        store(run_dir, SECRET)
        path = run_dir / "inputs" / "table.parquet"
        table.to_parquet(path, index=False)
        encoded = run_dir / "inputs" / "encoded.npy"
        np.save(encoded, np.zeros((len(table), TableEncoder(schema).width), dtype=np.float32))
        np.save(run_dir / "inputs" / "gan_rows.npy", np.arange(0, len(table), 2))
        prepared = training.prepare_stage(
            run_dir, schema, path, encoded, run_dir / "inputs" / "gan_rows.npy", profile, setting, cluster=address
        )
        critics.append(torch.load(prepared["critics"], weights_only=True))
    here, there = critics
    assert "pretrain_chunk_task" in _task_prefixes(cluster)  # the chunks did run on the workers
    assert here["batchnorm"] == there["batchnorm"]
    assert len(here["params"]) == len(there["params"]) > 0
    for mine, theirs in zip(here["params"], there["params"], strict=True):
        assert torch.equal(mine, theirs)


def _task_prefixes(address: str) -> set[str]:
    from distributed import Client

    with Client(address) as client:
        return set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes)))
