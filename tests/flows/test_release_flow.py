"""A smoke release end to end on generated data: every stage runs, MLflow records it, a rerun skips."""

import json

from mlflow.tracking import MlflowClient

from flows.cli import main
from tests.conftest import CARDIO_SCHEMA


def test_smoke_release_runs_every_stage_and_is_tracked(isolated_workdir, demo_csv, capfd):
    out = isolated_workdir / "run"
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile", "smoke",
            "--out", str(out), "--json"]
    assert main(argv) == 0
    summary = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    for key in ("release_id", "epsilon", "delta", "auc", "mlflow_run_id"):
        assert key in summary
    ledger = json.loads((out / "train-k10" / "checkpoints" / "ledger.json").read_text())["checkpoints"]
    assert summary["epsilon"] == {e["iteration"]: e["epsilon"] for e in ledger}[summary["iteration"]]
    assert 0.0 <= summary["auc"] <= 1.0
    for stage in ("validate", "split", "preprocess", "pretrain-k10", "train-k10", "sample-k10", "evaluate-k10"):
        assert (out / stage / "manifest.json").exists(), stage
    run = MlflowClient().get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["dpsynth.data_sha256"]
    assert "profile.gan.batch_size" in run.data.params

    # A rerun finds every stage done and gives the same answer.
    assert main(argv) == 0
    again = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert again["epsilon"] == summary["epsilon"] and again["auc"] == summary["auc"]
