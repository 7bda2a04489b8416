"""Every generator through the one release flow: `dpsynth release --generator G` registers
`<dataset>-G`, publishes only what its replace-one epsilon covers, and samples through the pyfunc model;
the lifetime ledger adds its published epsilon (its add/remove curve is never composed with others)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from dpsynth.flows.cli import main
from dpsynth.models.config import load_profile
from dpsynth.models.generators import get
from dpsynth.tasks.bundle import bundle_contains_no_real_rows
from dpsynth.tasks.decision import statement_for
from dpsynth.tasks.registry import load_released_model, registry_client
from tests.conftest import CARDIO_SCHEMA, publishing_smoke
from tests.flows.test_release_flow import _assert_published_is_dp_covered, _last_json, _published_texts


def _smoke_with(tmp_path, sections: dict) -> str:
    """The smoke profile as a publishing release (tests.conftest.publishing_smoke) with `sections` merged
    over it, as a profile file (a path: --profile takes one)."""
    publishing_smoke(tmp_path)
    path = tmp_path / "smoke-variant.yaml"
    path.write_text(yaml.safe_dump({"extends": "smoke", **sections}))
    return str(path)


@pytest.mark.parametrize(
    "generator,sections",
    [
        ("dpcgan", {}),
        ("dpautogan", {}),
        (
            "dpautogan",
            {"dpautogan": {"latent_model": "gaussian", "latent_noise": 5.0, "moment_noise": 7.0, "moment_steps": 20}},
        ),
    ],
    ids=["dpcgan", "dpautogan", "dpautogan-gaussian-moments"],
)
def test_release_with_another_generator(isolated_workdir, demo_csv, demo_frame, capfd, tmp_path, generator, sections):
    profile_arg = _smoke_with(tmp_path / "profiles", sections) if sections else publishing_smoke(tmp_path / "profiles")
    argv = [
        "release",
        "--config",
        str(CARDIO_SCHEMA),
        "--data",
        str(demo_csv),
        "--profile",
        profile_arg,
        "--generator",
        generator,
        "--json",
    ]
    assert main(argv) == 0
    summary = _last_json(capfd)
    out = isolated_workdir / summary["run_dir"]
    profile = load_profile(profile_arg, CARDIO_SCHEMA).with_generator(generator)
    setting = profile.release_target()
    plan = get(generator).plan(profile, setting)
    ledger = json.loads((out / "train-k10" / "ledger.json").read_text())
    assert ledger["generator"] == generator and ledger["adjacency"].startswith("replace one row")
    entries = ledger["checkpoints"]
    # Trained to the planned last checkpoint; the release pays the replace-one epsilon there (with the DP
    # choice), never Opacus's add/remove-one figure.
    assert [e["iteration"] for e in entries] == list(plan.iterations)
    assert entries[-1]["epsilon"] == pytest.approx(plan.epsilon, rel=1e-12)
    assert summary["epsilon"] == max(plan.epsilon, profile.privacy.choice_epsilon)
    assert summary["epsilon_training"] == pytest.approx(plan.epsilon, rel=1e-12)
    assert summary["model_uri"] == f"models:/cardio-{generator}/1"
    assert not (out / "pretrain-k10").exists() and (out / "prepare-k10" / "manifest.json").exists()

    client, registry = MlflowClient(), registry_client()
    champion = registry.get_model_version_by_alias(f"cardio-{generator}", "champion")
    assert champion.tags["generator"] == generator and float(champion.tags["epsilon"]) == summary["epsilon"]
    assert champion.tags["iteration"] == str(summary["iteration"])
    assert "K" not in champion.tags and "discriminator_draw" not in champion.tags
    statement = statement_for(profile, setting, release=True)
    assert get(generator).label in statement.covers and statement.covers in champion.description
    release = json.loads((out / "bundle" / "release.json").read_text())
    facts = get(generator).privacy_facts(profile, setting)
    assert (
        release["epsilon"] == summary["epsilon"] and release["accountant"]["parameters"]["generator"] == facts.generator
    )
    if sections:  # the Gaussian latent model and the moment query: trained to the fit, both noises published
        assert list(plan.iterations) == [0, profile.dpautogan.autoencoder_steps + 1]
        assert facts.generator == "DP-auto-GAN (Gaussian latent model)" and champion.tags["sigma_latent"] == "5.0"
        assert champion.tags["sigma_moments"] == "7.0"
        assert (
            "the Gaussian fit adds noise to the latents' sums; the moment query to the moments' sums"
            in statement.covers
        )
    released = torch.load(out / "bundle" / "generator.pt", weights_only=True)
    assert released["generator_type"] == generator and released["epsilon"] == summary["epsilon"]
    assert "adjacency" not in released  # the checkpoint's add/remove-one label does not travel

    run = client.get_run(summary["mlflow_run_id"])
    split = np.load(out / "split" / "split.npz")
    texts = _published_texts(registry, f"cardio-{generator}", champion.version, out / "bundle", tmp_path / "dl")
    _assert_published_is_dp_covered(
        texts,
        data_hash=run.data.tags["dpsynth.data_sha256"],
        internal_paths=[str(isolated_workdir), str(out), str(tmp_path)],
        real_aucs=[summary["auc"], summary["real_auc"]],
        row_counts=[len(split["train"]), len(split["train"]) + len(split["val"]), len(demo_frame)],
    )
    for where, text in texts.items():  # the add/remove-one epsilons stay in the run folder
        for entry in entries[1:]:  # (iteration 0 costs 0.0 either way)
            assert repr(entry["epsilon_add_remove"]) not in text, where
    assert bundle_contains_no_real_rows(out / "bundle", demo_frame) == []

    # The pyfunc model samples what the bundle's generator samples, for this generator too.
    rows = load_released_model(f"models:/cardio-{generator}@champion").predict(
        pd.DataFrame({"n_rows": [40], "seed": [3]})
    )
    from dpsynth.models.data.schema import DatasetSchema
    from dpsynth.tasks.training import sample_generator_file

    expected = sample_generator_file(out / "bundle" / "generator.pt", DatasetSchema.from_yaml(CARDIO_SCHEMA), 40, 3)
    pd.testing.assert_frame_equal(rows.reset_index(drop=True), expected.reset_index(drop=True), check_dtype=False)

    # The ledger counts the published epsilon, without an RDP curve to compose with GS-WGAN's.
    assert main(["ledger", "--config", str(CARDIO_SCHEMA), "--json"]) == 0
    book = _last_json(capfd)
    assert book["spent_epsilon"] == pytest.approx(summary["epsilon"])


def test_epsilon_command_plans_every_generator(capfd):
    assert (
        main(["epsilon", "--profile", "smoke", "--config", str(CARDIO_SCHEMA), "--generator", "dpcgan", "--json"]) == 0
    )
    plan = _last_json(capfd)["settings"]
    profile = load_profile("smoke", CARDIO_SCHEMA).with_generator("dpcgan")
    expected = {s.name: get("dpcgan").plan(profile, s) for s in profile.settings if s.private}
    assert {row["setting"]: row["epsilon_training"] for row in plan if row["setting"] in expected} == pytest.approx(
        {name: p.epsilon for name, p in expected.items()}
    )


def test_dp_sgd_generator_refuses_a_non_private_setting(isolated_workdir, demo_csv, capfd, tmp_path):
    path = _smoke_with(
        tmp_path, {"release_setting": "np", "settings": [{"name": "np", "generator": "dpcgan", "private": False}]}
    )
    code = main(["release", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile", path])
    err = capfd.readouterr().err
    assert code == 2 and "non-private baseline is GS-WGAN" in err and "Traceback" not in err
    assert not list(isolated_workdir.glob("runs/release/*"))


def test_generator_option_leaves_the_non_private_baseline_on_gswgan():
    profile = load_profile("smoke", CARDIO_SCHEMA).with_generator("dpautogan")
    assert {s.name: profile.generator_of(s) for s in profile.settings} == {"baseline": "gswgan", "k10": "dpautogan"}
