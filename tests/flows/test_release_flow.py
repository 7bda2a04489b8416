"""A smoke release end to end on generated data: every stage runs, MLflow records it, the generator is
registered as champion, the bundle holds no real row, a rerun skips, and an over-budget release is
refused with the champion left in place."""

import json

import mlflow
import pandas as pd
import yaml
from mlflow.tracking import MlflowClient

from flows.cli import main
from models.config import load_profile
from models.gswgan import kernels_in_use
from tasks.bundle import bundle_contains_no_real_rows
from tests.conftest import CARDIO_SCHEMA, ROOT


def _last_json(capfd):
    return json.loads(capfd.readouterr().out.strip().splitlines()[-1])


def _release_with(workdir, data, name: str, section: str, key: str, value) -> int:
    """A smoke release whose profile changes one key; returns the exit status. Runs in `<name>-run`."""
    profile = yaml.safe_load((ROOT / "configs" / "profiles" / "smoke.yaml").read_text())
    profile[section][key] = value
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(profile))
    return main(["release", "--config", str(CARDIO_SCHEMA), "--data", str(data), "--profile", str(path),
                 "--out", str(workdir / f"{name}-run")])


def test_smoke_release_end_to_end(isolated_workdir, demo_csv, demo_frame, capfd):
    out = isolated_workdir / "run"
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile", "smoke",
            "--out", str(out), "--json"]
    assert main(argv) == 0
    summary = _last_json(capfd)
    for key in ("release_id", "epsilon", "delta", "auc", "bundle_dir", "model_uri", "mlflow_run_id"):
        assert key in summary
    ledger = json.loads((out / "train-k10" / "checkpoints" / "ledger.json").read_text())["checkpoints"]
    assert summary["epsilon"] == {e["iteration"]: e["epsilon"] for e in ledger}[summary["iteration"]]
    assert 0.0 <= summary["auc"] <= 1.0
    for stage in ("validate", "split", "preprocess", "pretrain-k10", "train-k10", "sample-k10",
                  "evaluate-k10/000", "evaluate-real/000", "report"):
        assert (out / stage / "manifest.json").exists(), stage
    # Which code computed the critics (C kernels or tensor operations) is on record with the stages.
    expected = kernels_in_use(load_profile("smoke", CARDIO_SCHEMA).gan, "cpu")
    assert json.loads((out / "pretrain-k10" / "manifest.json").read_text())["info"]["kernels"] == expected
    assert (json.loads((out / "train-k10" / "manifest.json").read_text())["info"]["critic_updates"]
            == expected["critic_updates"])

    client = MlflowClient()
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["dpsynth.data_sha256"]
    assert "profile.gan.batch_size" in run.data.params
    champion = client.get_model_version_by_alias("cardio-gswgan", "champion")
    for tag in ("epsilon", "delta", "accountant", "sigma", "C", "K", "T", "batch_size", "data_sha256",
                "schema_version", "code_version", "release_auc", "report"):
        assert tag in champion.tags, tag
    rows = mlflow.pyfunc.load_model("models:/cardio-gswgan@champion").predict(
        pd.DataFrame({"n_rows": [50], "seed": [3]}))
    assert len(rows) == 50 and list(rows.columns) == [c.name for c in __import__("models.schema").schema
                                                      .DatasetSchema.from_yaml(CARDIO_SCHEMA).columns]

    bundle = out / "bundle"
    release = json.loads((bundle / "release.json").read_text())
    assert release["epsilon"] == summary["epsilon"] and release["model_uri"] == summary["model_uri"]
    assert bundle_contains_no_real_rows(bundle, demo_frame) == []
    published = " ".join(p.read_text(errors="ignore") for p in bundle.glob("*.md"))
    for value in (summary["auc"], summary["real_auc"]):  # AUCs are measured on real rows: never published
        assert f"{value:.3f}" not in published and f"{value:.4f}" not in published

    # A rerun finds every stage done and gives the same answer.
    assert main(argv) == 0
    again = _last_json(capfd)
    assert again["epsilon"] == summary["epsilon"] and again["auc"] == summary["auc"]

    # Over budget: refused before anything runs; the champion stays.
    assert _release_with(isolated_workdir, demo_csv, "tight", "privacy", "epsilon_budget", 1.0) == 5
    assert "budget" in capfd.readouterr().err
    assert client.get_model_version_by_alias("cardio-gswgan", "champion").version == champion.version

    # Not approved (AUC under the profile's floor): refused after evaluation, nothing published.
    assert _release_with(isolated_workdir, demo_csv, "strict", "evaluation", "min_release_auc", 0.999) == 6
    assert "approval floor" in capfd.readouterr().err
    assert not (isolated_workdir / "strict-run" / "bundle").exists()
    assert client.get_model_version_by_alias("cardio-gswgan", "champion").version == champion.version
