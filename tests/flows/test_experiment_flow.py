"""The smoke experiment end to end: on the default process pool and on a local Dask cluster."""

import itertools
import json

import pandas as pd
import yaml
from mlflow.tracking import MlflowClient

from dpsynth.flows.cli import main
from tests.conftest import CARDIO_SCHEMA, ROOT


def test_thesis_plan_has_287_selection_runs(demo_csv, capfd):
    assert (
        main(
            [
                "experiment",
                "--config",
                str(CARDIO_SCHEMA),
                "--data",
                str(demo_csv),
                "--profile",
                "thesis",
                "--dry-run",
                "--json",
            ]
        )
        == 0
    )
    plan = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert plan["selection_runs"] == 287 and plan["checkpoints_per_setting"] == 41
    assert plan["discriminators"] == [1, 250, 500, 750, 1000, 1500]


def _check_experiment(out, summary):
    results = pd.read_parquet(out / "results.parquet")
    assert set(results["setting"]) == {"baseline", "k10", "real"}
    assert summary["selection_runs"] == summary["planned_selection_runs"] == len(results) == 9
    assert (out / "report" / "report.html").exists()
    assert any(c.startswith("share:cardio=") for c in results.columns)
    assert results.loc[results["setting"] == "baseline", "epsilon"].map(lambda e: e == float("inf")).all()


def test_smoke_experiment_on_process_pool_and_rerun_skips(isolated_workdir, demo_csv, capfd):
    out = isolated_workdir / "exp"
    argv = [
        "experiment",
        "--config",
        str(CARDIO_SCHEMA),
        "--data",
        str(demo_csv),
        "--profile",
        "smoke",
        "--out",
        str(out),
        "--json",
    ]
    assert main(argv) == 0
    captured = capfd.readouterr()
    # --json: nothing on stderr, from the flow's process or from its workers (which inherit the setting).
    assert captured.err == "", captured.err
    summary = json.loads(captured.out.strip().splitlines()[-1])
    _check_experiment(out, summary)
    done = [
        out / "train-k10" / "manifest.json",
        out / "evaluate-k10" / "001" / "manifest.json",
        out / "evaluate-real" / "002" / "manifest.json",
    ]
    stamps = [p.stat().st_mtime for p in done]
    assert main(argv) == 0
    assert [p.stat().st_mtime for p in done] == stamps  # training and selection runs are not recomputed
    again = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    # A completed experiment run again: its summary, no second MLflow run.
    assert again["reused"] is True and again["mlflow_run_id"] == summary["mlflow_run_id"]
    assert len(MlflowClient().search_runs([MlflowClient().get_run(summary["mlflow_run_id"]).info.experiment_id])) == 1


def test_smoke_experiment_on_local_dask_cluster(isolated_workdir, demo_csv, capfd):
    from distributed import LocalCluster

    profile = yaml.safe_load((ROOT / "configs" / "profiles" / "smoke.yaml").read_text())
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        profile["dask_address"] = cluster.scheduler_address
        path = isolated_workdir / "smoke-dask.yaml"
        path.write_text(yaml.safe_dump(profile))
        out = isolated_workdir / "exp"
        assert (
            main(
                [
                    "experiment",
                    "--config",
                    str(CARDIO_SCHEMA),
                    "--data",
                    str(demo_csv),
                    "--profile",
                    str(path),
                    "--out",
                    str(out),
                    "--json",
                ]
            )
            == 0
        )
    summary = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    _check_experiment(out, summary)


def test_settings_start_largest_k_first_one_after_another_on_one_worker(isolated_workdir, demo_csv, capfd):
    """With one worker, each setting's pretraining starts after the previous setting's training has
    ended, in decreasing K (the order the flow submits them in, one at a time)."""
    from datetime import datetime

    profile = yaml.safe_load((ROOT / "configs" / "profiles" / "smoke.yaml").read_text())
    profile["settings"] = [
        {"name": "baseline", "discriminators": 1, "private": False},
        # Three and two critics: the order is what is checked, and a setting's pretraining grows with its K.
        {"name": "k2", "discriminators": 2, "private": True},
        {"name": "k3", "discriminators": 3, "private": True},
    ]
    profile["workers"] = 1
    profile["evaluation"]["real_baseline"] = False
    path = isolated_workdir / "smoke-one-worker.yaml"
    path.write_text(yaml.safe_dump(profile))
    out = isolated_workdir / "exp"
    assert (
        main(
            [
                "experiment",
                "--config",
                str(CARDIO_SCHEMA),
                "--data",
                str(demo_csv),
                "--profile",
                str(path),
                "--out",
                str(out),
                "--json",
            ]
        )
        == 0
    )

    def span(stage):
        manifest = json.loads((out / stage / "manifest.json").read_text())
        start = datetime.fromisoformat(manifest["started"]).timestamp()
        return start, start + manifest["seconds"]

    order = ["k3", "k2", "baseline"]
    for earlier, later in itertools.pairwise(order):
        assert span(f"train-{earlier}")[1] <= span(f"pretrain-{later}")[0]


def test_compare_profile_matches_whole_release_epsilon_across_generators(demo_csv, capfd):
    """`compare` trains each generator to its budget: 1 and 3 for the whole release (training with the
    DP choice), each setting's checkpoint chosen as a release would choose it."""
    from dpsynth.models.config import load_profile
    from dpsynth.models.generator_registry import names
    from dpsynth.models.generators import generator_for
    from dpsynth.models.privacy.release_choice import whole_release_epsilon

    profile = load_profile("compare", CARDIO_SCHEMA)
    assert profile.evaluation.experiment_choice == "dp"
    budgets = {}
    for setting in profile.settings:
        plan = generator_for(profile, setting).plan(profile, setting)
        whole = whole_release_epsilon(profile, plan.epsilon)
        assert whole <= setting.epsilon_budget and plan.epsilon > 0.85 * setting.epsilon_budget, setting.name
        budgets.setdefault(setting.epsilon_budget, set()).add(profile.generator_of(setting))
    every_generator = set(names())  # compare sets every registered generator beside the others
    assert budgets == {1.0: every_generator, 3.0: every_generator}
    assert (
        main(
            [
                "experiment",
                "--config",
                str(CARDIO_SCHEMA),
                "--data",
                str(demo_csv),
                "--profile",
                "compare",
                "--dry-run",
                "--json",
            ]
        )
        == 0
    )
    plan = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert plan["generators"]["dpautogan-eps3"] == "dpautogan" and plan["selection_runs"] == sum(
        plan["checkpoints"].values()
    )


def test_experiment_compares_generators_side_by_side(isolated_workdir, demo_csv, capfd):
    profile = yaml.safe_load((ROOT / "configs" / "profiles" / "smoke.yaml").read_text())
    profile.update(
        settings=[
            {"name": "gs", "generator": "gswgan", "discriminators": 10},
            {"name": "cgan", "generator": "dpcgan", "epsilon_budget": 1.5},
            {"name": "auto", "generator": "dpautogan", "epsilon_budget": 2.0},
        ],
        release_setting="gs",
    )
    profile["evaluation"].update(experiment_choice="dp", real_baseline=False)
    path = isolated_workdir / "mixed.yaml"
    path.write_text(yaml.safe_dump(profile))
    out = isolated_workdir / "exp"
    assert (
        main(
            [
                "experiment",
                "--config",
                str(CARDIO_SCHEMA),
                "--data",
                str(demo_csv),
                "--profile",
                str(path),
                "--out",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    summary = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    table = summary["comparison"]
    assert {name: row["generator"] for name, row in table.items()} == {
        "gs": "gswgan",
        "cgan": "dpcgan",
        "auto": "dpautogan",
    }
    for name, budget in (("cgan", 1.5), ("auto", 2.0)):
        # The DP choice's epsilon: the whole release's, within the setting's budget, never below training's.
        ledger = json.loads((out / f"train-{name}" / "ledger.json").read_text())["checkpoints"]
        assert table[name]["epsilon"] == max(ledger[-1]["epsilon"], 1.0) <= budget
        for key in ("test_auc", "spearman_mad", "mean_tvd", "mean_wasserstein"):
            assert 0.0 <= table[name][key] <= 1.0
    assert "Generators compared" in (out / "report" / "report.html").read_text()
