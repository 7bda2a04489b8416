"""MST through the one release flow: `dpsynth release --generator mst` on the publishing smoke profile
registers `cardio-mst`, pays the project's conversion of its rho plus the measured marginals' (with the DP
choice), publishes its labelled parameters and nothing outside what that epsilon covers, enters its
replace-one zCDP curve in the lifetime ledger, and its registered model samples in a fresh process
without dpsynth, jax or private-pgm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient

from dpsynth.flows.cli import main
from dpsynth.models.config import load_profile
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators import get
from dpsynth.models.generators.mst.adapter import training_rho
from dpsynth.models.marginals.measure import epsilon_of_rho
from dpsynth.tasks import ledger as ledger_mod
from dpsynth.tasks.bundle import bundle_contains_no_real_rows
from dpsynth.tasks.registry import load_released_model, registry_client, registry_uri
from dpsynth.tasks.training import sample_generator_file
from tests.conftest import CARDIO_SCHEMA, ROOT, publishing_smoke
from tests.flows.test_release_flow import _assert_published_is_dp_covered, _last_json, _published_texts


def test_release_with_mst(isolated_workdir, demo_csv, demo_frame, capfd, tmp_path):
    profile_arg = publishing_smoke(tmp_path / "profiles")
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile", profile_arg]
    assert main([*argv, "--generator", "mst", "--json"]) == 0
    summary = _last_json(capfd)
    out = isolated_workdir / summary["run_dir"]
    profile = load_profile(profile_arg, CARDIO_SCHEMA).with_generator("mst")
    setting = profile.release_target()
    rho = training_rho(profile, setting)  # null mst.rho: the largest within the smoke budget (1000)
    plan = get("mst").plan(profile, setting)
    trained = epsilon_of_rho(rho + profile.marginals.rho, profile.privacy.delta)
    assert plan.iterations == (0, 1) and plan.epsilon == trained <= profile.privacy.epsilon_budget

    ledger = json.loads((out / "train-k10" / "ledger.json").read_text())
    assert ledger["generator"] == "mst" and ledger["adjacency"].startswith("replace one row")
    assert [(e["iteration"], e["epsilon"]) for e in ledger["checkpoints"]] == list(
        zip(plan.iterations, plan.epsilons, strict=True)
    )
    assert summary["epsilon_training"] == trained
    assert summary["epsilon"] == max(trained, profile.privacy.choice_epsilon)
    assert summary["model_uri"] == "models:/cardio-mst/1"

    registry = registry_client()
    champion = registry.get_model_version_by_alias("cardio-mst", "champion")
    assert champion.tags["generator"] == "mst" and float(champion.tags["epsilon"]) == summary["epsilon"]
    assert float(champion.tags["mst_rho"]) == rho and "K" not in champion.tags
    release = json.loads((out / "bundle" / "release.json").read_text())
    parameters = release["accountant"]["parameters"]
    assert parameters["generator"] == "MST" and parameters["mst_rho"] == rho
    assert parameters["mst_gaussian_sensitivity"] == 2**0.5 and parameters["mst_score_sensitivity"] == 2.0
    notes = (out / "bundle" / "RELEASE_NOTES.md").read_text()
    assert "MST's zCDP rho (replace-one)" in notes
    assert "rho of the tree's selection rounds (mst.selection_share of the rest)" in notes
    released = torch.load(out / "bundle" / "generator.pt", weights_only=True)
    assert released["generator_type"] == "mst" and released["epsilon"] == summary["epsilon"]

    run = MlflowClient().get_run(summary["mlflow_run_id"])
    split = np.load(out / "split" / "split.npz")
    texts = _published_texts(registry, "cardio-mst", champion.version, out / "bundle", tmp_path / "dl")
    _assert_published_is_dp_covered(
        texts,
        data_hash=run.data.tags["dpsynth.data_sha256"],
        internal_paths=[str(isolated_workdir), str(out), str(tmp_path)],
        real_aucs=[summary["auc"], summary["real_auc"]],
        row_counts=[len(split["train"]), len(split["train"]) + len(split["val"]), len(demo_frame)],
    )
    assert bundle_contains_no_real_rows(out / "bundle", demo_frame) == []

    # The pyfunc model samples what the bundle's generator samples.
    rows = load_released_model("models:/cardio-mst@champion").predict(pd.DataFrame({"n_rows": [40], "seed": [3]}))
    expected = sample_generator_file(out / "bundle" / "generator.pt", DatasetSchema.from_yaml(CARDIO_SCHEMA), 40, 3)
    pd.testing.assert_frame_equal(rows.reset_index(drop=True), expected.reset_index(drop=True), check_dtype=False)

    # The lifetime ledger holds MST's replace-one zCDP line (its rho with the marginals'), to compose.
    (entry,) = ledger_mod.entries("cardio")
    assert entry.cost.training is not None and entry.cost.training.iterations == 0
    assert entry.cost.training.marginals_rho == pytest.approx(rho + profile.marginals.rho, rel=1e-12)
    assert main(["ledger", "--config", str(CARDIO_SCHEMA), "--json"]) == 0
    assert _last_json(capfd)["spent_epsilon"] <= summary["epsilon"]

    # In a fresh process where dpsynth is not importable: the registered model's own code samples it,
    # with neither jax nor private-pgm.
    script = textwrap.dedent(f"""
        import importlib.util, json, sys
        sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in repr(f)
                            and "__editable__" not in (getattr(f, "__module__", "") or "")]
        sys.path_hooks[:] = [h for h in sys.path_hooks if "__editable__" not in (getattr(h, "__module__", "") or "")]
        sys.path[:] = [p for p in sys.path if p not in ("", {str(ROOT)!r})]
        sys.path_importer_cache.clear()
        assert importlib.util.find_spec("dpsynth") is None, "dpsynth is still importable"
        import mlflow.pyfunc, pandas as pd
        rows = mlflow.pyfunc.load_model("models:/cardio-mst@champion").predict(
            pd.DataFrame({{"n_rows": [40], "seed": [3]}}))
        print(json.dumps({{"rows": rows.astype(str).values.tolist(),
                          "heavy": [m for m in ("jax", "jaxlib", "mbi") if m in sys.modules]}}))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MLFLOW_TRACKING_URI"] = registry_uri()
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = json.loads(done.stdout.strip().splitlines()[-1])
    assert fresh["heavy"] == [] and fresh["rows"] == expected.astype(str).values.tolist()
