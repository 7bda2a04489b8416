"""The experiment's task runner comes from its profile, whichever way it runs (command line or deployment)."""

import dataclasses

import yaml
from prefect import flow
from prefect.context import FlowRunContext
from prefect.task_runners import ProcessPoolTaskRunner
from prefect_dask import DaskTaskRunner

import dpsynth.flows.experiment as experiment_module
from dpsynth.flows.experiment import experiment, task_runner_for
from dpsynth.models.config import load_profile
from tests.conftest import CARDIO_SCHEMA, ROOT


def test_the_profile_chooses_a_dask_cluster_or_a_process_pool_of_its_workers():
    smoke = load_profile("smoke", CARDIO_SCHEMA)
    assert task_runner_for(smoke) == ProcessPoolTaskRunner(max_workers=2)
    assert task_runner_for(dataclasses.replace(smoke, workers=3)) == ProcessPoolTaskRunner(max_workers=3)
    on_dask = dataclasses.replace(smoke, workers=3, dask_address="tcp://10.0.0.5:8786")
    assert task_runner_for(on_dask) == DaskTaskRunner(address="tcp://10.0.0.5:8786")


def test_the_experiment_flow_runs_the_grid_on_the_runner_its_profile_names(tmp_path, monkeypatch):
    """`experiment` is the deployment's entrypoint and the command line's flow: the grid it starts runs on
    the profile's runner (here a pool of 3), not on the grid's own default pool of 2."""
    (tmp_path / "smoke.yaml").symlink_to(ROOT / "configs" / "profiles" / "smoke.yaml")
    profile = tmp_path / "three-workers.yaml"
    profile.write_text(yaml.safe_dump({"extends": "smoke", "workers": 3}))

    @flow(name="experiment-grid", task_runner=ProcessPoolTaskRunner(max_workers=2))
    def grid_that_reports_its_runner(config, data, profile, out, generator=None):
        return {"runner": FlowRunContext.get().task_runner, "args": (config, data, profile, out, generator)}

    monkeypatch.setattr(experiment_module, "experiment_grid", grid_that_reports_its_runner)
    seen = experiment(
        config=str(CARDIO_SCHEMA), data="table.csv", profile=str(profile), out="runs/x", generator="dpcgan"
    )
    assert seen["runner"] == ProcessPoolTaskRunner(max_workers=3)
    assert seen["args"] == (str(CARDIO_SCHEMA), "table.csv", str(profile), "runs/x", "dpcgan")
