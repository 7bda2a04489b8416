"""`dpsynth release --generator aim` end to end on a generated table, as a trial (`--no-publish`): every
stage runs, nothing is published, and what the run records is what AIM's plan pays (the conversion of
its rho plus the measured marginals', the smoke profile measures them), with its rounds' rho adding up
to its rho and the sampled rows schema-shaped."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dpsynth.flows.cli import main
from dpsynth.models.config import load_profile
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators import get
from dpsynth.models.generators.aim.adapter import training_rho
from dpsynth.models.marginals.measure import epsilon_of_rho
from tests.conftest import CARDIO_SCHEMA, publishing_smoke
from tests.flows.test_release_flow import _last_json

# Smoke-sized: a fixed rho (null would take the largest under smoke's budget of 1000) and the fewest
# rounds Cardio's 12 columns allow, few estimator iterations.
SMOKE_AIM = {"rho": 0.5, "rounds": 13, "round_iterations": 20, "iterations": 50}


def test_aim_trial_release(isolated_workdir, demo_csv, capfd, tmp_path):
    profile_arg = publishing_smoke(tmp_path / "profiles", aim=SMOKE_AIM)
    profile = load_profile(profile_arg, CARDIO_SCHEMA).with_generator("aim")
    setting = profile.release_target()
    plan = get("aim").plan(profile, setting)
    trained = epsilon_of_rho(training_rho(profile, setting) + profile.marginals.rho, profile.privacy.delta)
    assert plan.iterations == (0, 1) and plan.epsilon == trained and profile.marginals.enabled

    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile", profile_arg]
    assert main([*argv, "--generator", "aim", "--json", "--no-publish"]) == 0
    summary = _last_json(capfd)
    assert summary["published"] is False and summary["trial"] is True
    assert summary["epsilon_training"] == trained
    out = isolated_workdir / summary["run_dir"]
    assert not (out / "bundle").exists() and (out / "report" / "report.html").exists()

    ledger = json.loads((out / "train-k10" / "ledger.json").read_text())
    assert ledger["generator"] == "aim" and ledger["adjacency"].startswith("replace one row")
    assert [(e["iteration"], e["epsilon"]) for e in ledger["checkpoints"]] == list(
        zip(plan.iterations, plan.epsilons, strict=True)
    )
    info = json.loads((out / "train-k10" / "manifest.json").read_text())["info"]["aim"]
    # AIM's rounds spend its rho less the share that measures the continuous columns' fine histograms.
    rounds_rho = 0.5 * (1 - profile.section("aim").shape_share)
    assert info["rho_spent"] == pytest.approx(rounds_rho, rel=1e-12) and len(info["rounds"]) >= 1

    rows = pd.read_parquet(out / "sample-k10" / "synthetic_000001.parquet")
    assert list(rows.columns) == DatasetSchema.from_yaml(CARDIO_SCHEMA).column_names and len(rows) > 0
