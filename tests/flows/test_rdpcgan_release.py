"""`dpsynth release --generator rdpcgan` end to end on a generated table, with the shipped smoke profile's
`rdpcgan` section: a publishing release registers `cardio-rdpcgan` at the replace-one epsilon of its plan
(measured marginals included, the smoke profile measures them), and the pyfunc model samples what the
bundle's generator samples. One release only (a trial's stages are the same and the release flow's tests
cover `--no-publish` for every generator type)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from dpsynth.flows.cli import main
from dpsynth.models.config import load_profile
from dpsynth.models.generators import get
from dpsynth.tasks.bundle import bundle_contains_no_real_rows
from dpsynth.tasks.registry import load_released_model, registry_client
from tests.conftest import CARDIO_SCHEMA, publishing_smoke
from tests.flows.test_release_flow import _last_json


def _release(demo_csv, profile: str) -> int:
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile", profile]
    return main([*argv, "--generator", "rdpcgan", "--json"])


def test_rdpcgan_publishing_release(isolated_workdir, demo_csv, demo_frame, capfd, tmp_path):
    profile_arg = publishing_smoke(tmp_path / "profiles")  # the shipped smoke section: a few dozen updates
    profile = load_profile(profile_arg, CARDIO_SCHEMA).with_generator("rdpcgan")
    setting = profile.release_target()
    plan = get("rdpcgan").plan(profile, setting)
    assert plan.iterations == (0, 20, 30, 40) and profile.marginals.enabled

    assert _release(demo_csv, profile_arg) == 0
    summary = _last_json(capfd)
    assert summary["published"] is True and summary["epsilon_training"] == pytest.approx(plan.epsilon, rel=1e-12)
    out = isolated_workdir / summary["run_dir"]
    ledger = json.loads((out / "train-k10" / "ledger.json").read_text())
    assert ledger["generator"] == "rdpcgan" and ledger["adjacency"].startswith("replace one row")
    entries = ledger["checkpoints"]
    assert [e["iteration"] for e in entries] == list(plan.iterations)
    assert entries[-1]["epsilon"] == pytest.approx(plan.epsilon, rel=1e-12)
    assert entries[-1]["epsilon"] > entries[-1]["epsilon_add_remove"]  # replace-one, never add/remove-one
    assert summary["epsilon"] == max(plan.epsilon, profile.privacy.choice_epsilon)
    assert summary["model_uri"] == "models:/cardio-rdpcgan/1"

    champion = registry_client().get_model_version_by_alias("cardio-rdpcgan", "champion")
    assert champion.tags["generator"] == "rdpcgan" and float(champion.tags["epsilon"]) == summary["epsilon"]
    assert champion.tags["sigma2"] == str(profile.rdpcgan.critic_noise)
    release = json.loads((out / "bundle" / "release.json").read_text())
    assert release["accountant"]["parameters"]["generator"] == "RDP-CGAN"
    released = torch.load(out / "bundle" / "generator.pt", weights_only=True)
    assert released["generator_type"] == "rdpcgan" and "adjacency" not in released
    assert bundle_contains_no_real_rows(out / "bundle", demo_frame) == []

    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.tasks.training import sample_generator_file

    rows = load_released_model("models:/cardio-rdpcgan@champion").predict(pd.DataFrame({"n_rows": [40], "seed": [3]}))
    expected = sample_generator_file(out / "bundle" / "generator.pt", DatasetSchema.from_yaml(CARDIO_SCHEMA), 40, 3)
    pd.testing.assert_frame_equal(rows.reset_index(drop=True), expected.reset_index(drop=True), check_dtype=False)
