"""Every registered generator keeps the generator interface's promises (models/generators/base.py), run
through the real stages (tasks/training.py) on smoke-profile-size training on generated tables:

* its plan stays within the budget, and every planned epsilon is what its trainer's ledger records;
* training to a middle checkpoint and then to the end releases what one uninterrupted run releases;
* its light sampler (the pyfunc model's path: a released file, no hint) gives the rows the sample stage
  wrote and the level shares the training ledger holds, for the same seeds;
* every parameter it publishes has a label, and so does every key of the privacy summary;
* what it publishes (plan, epsilons, privacy facts, summary, the generator file's public entries) is the
  same for two different training tables: it depends on public profile values only.

The checks are functions of a `Trained` run, so that a generator registered elsewhere (the toy
generator of tests/flows/test_toy_generator.py) is held to the same ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dpsynth.models.config import Profile, Setting, load_profile
from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators import get, names, registration
from dpsynth.models.generators.base import TrainingJob, TrainingPlan
from dpsynth.models.generators.samplers import load_sampler, sample_rows
from dpsynth.models.privacy.secret import PrivacySecret, store
from dpsynth.tasks import training
from dpsynth.tasks.reporting import privacy_summary
from tests.conftest import CARDIO_SCHEMA, TEST_SECRET_HEX

SECRET = PrivacySecret.from_hex(TEST_SECRET_HEX)
# Training rows of each run: enough for every generator's batches, few enough to stay fast.
ROWS = 600
SAMPLED_ROWS = 300


@dataclass
class Trained:
    """One generator's runs for the checks: the stages on table A, a resumed fit, and table B's outputs."""

    name: str
    profile: Profile
    setting: Setting
    schema: DatasetSchema
    plan: TrainingPlan
    ledger: list[dict]  # the train stage's ledger (level shares included)
    checkpoints: Path
    samples: Path  # the sample stage's folder
    resumed: list[dict]  # ledger of a fit to a middle checkpoint, then to the end
    uninterrupted: list[dict]  # ledger of one fit to the end, in a folder of its own
    other_table: dict  # the public outputs of the same training on table B


# Smoke-sized sections for generators the shipped smoke profile does not size (their defaults are a
# full run's): a few dozen private updates each, as smoke sizes the others.
SMOKE_SECTIONS = {
    # Each fit starts the federation's server and a process per site (the flow tests run three sites):
    # two sites, two short rounds, tiny networks.
    "dpfedctgan": {
        "sites": {"iid": 2},
        "rounds": 2,
        "checkpoint_every": 1,
        "local_steps": 3,
        "sample_rate": 0.05,
        "z_dim": 8,
        "generator_hidden": (16,),
        "discriminator_hidden": (16,),
    },
    "rdpcgan": {
        "autoencoder_rate": 0.02,
        "critic_rate": 0.02,
        "autoencoder_steps": 20,
        "generator_steps": 20,
        "critic_steps": 2,
        "checkpoint_every": 10,
        "channels": (4, 8, 8),
    },
    # Null rho under smoke's budget (1000) would run hundreds of rounds: a fixed rho and the fewest rounds
    # Cardio's 12 columns allow (the 1-way marginals, then two or three rounds), few estimator iterations.
    "aim": {"rho": 0.5, "rounds": 13, "round_iterations": 20, "iterations": 50},
}


def smoke_profile(name: str) -> tuple[Profile, Setting]:
    """The shipped smoke profile with every private setting on `name`, and the setting a release trains."""
    profile = load_profile("smoke", CARDIO_SCHEMA).with_generator(name)
    if name in SMOKE_SECTIONS:
        section = registration(name).section
        profile = dataclasses.replace(profile, **{section: profile.sections[section].replace(**SMOKE_SECTIONS[name])})
    return profile, profile.release_target()


def _stage_inputs(folder: Path, schema: DatasetSchema, frame: pd.DataFrame) -> tuple[Path, Path, Path]:
    """The files the prepare stage reads: the table, its encoding, and the positions of its training rows."""
    folder.mkdir(parents=True, exist_ok=True)
    table, encoded, rows = folder / "table.parquet", folder / "encoded.npy", folder / "gan_rows.npy"
    frame.to_parquet(table, index=False)
    np.save(encoded, TableEncoder(schema).encode(frame).astype(np.float32))
    np.save(rows, np.arange(len(frame)))
    return table, encoded, rows


def _train(run_dir: Path, schema: DatasetSchema, frame: pd.DataFrame, profile: Profile, setting: Setting):
    run_dir.mkdir(parents=True, mode=0o700)
    store(run_dir, SECRET)
    table, encoded, rows = _stage_inputs(run_dir / "inputs", schema, frame)
    prepared = training.prepare_stage(run_dir, schema, table, encoded, rows, profile, setting)
    return prepared, training.train_stage(run_dir, schema, prepared.directory, profile, setting)


def _ledger(path: Path) -> list[dict]:
    return training.read_json(path)["checkpoints"]


def _holds_tensors(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensors(v) for v in value.values())
    return isinstance(value, (list, tuple)) and any(_holds_tensors(v) for v in value)


def public_file_entries(path: Path) -> dict:
    """A generator file's entries that are not weights (what the pyfunc model reports of it)."""
    blob = torch.load(path, map_location="cpu", weights_only=False)
    return {k: v for k, v in blob.items() if not _holds_tensors(v)}


def public_outputs(trained_stage, profile: Profile, setting: Setting, schema: DatasetSchema) -> dict:
    generator = get(profile.generator_of(setting))
    ledger = _ledger(trained_stage["ledger"])
    return {
        "plan": generator.plan(profile, setting),
        "ledger": [(e["iteration"], e["epsilon"]) for e in ledger],
        "files": [public_file_entries(trained_stage["checkpoints"] / e["generator"]) for e in ledger],
        "facts": generator.privacy_facts(profile, setting),
        "summary": privacy_summary(profile, [setting], schema),
    }


def train_for_checks(name: str, profile: Profile, setting: Setting, schema: DatasetSchema, folder: Path) -> Trained:
    """Everything the checks read, for generator `name` under `profile` (two tables, three runs)."""
    first, second = (make_demo_table(schema, ROWS, seed=seed) for seed in (11, 12))
    prepared, trained = _train(folder / "run", schema, first, profile, setting)
    samples = training.sample_stage(
        folder / "run", schema, trained["checkpoints"], trained["ledger"], SAMPLED_ROWS, profile, setting
    )
    generator, plan = get(name), get(name).plan(profile, setting)
    rows = np.load(prepared.directory / "train_rows.npy")
    middle = len(plan.iterations) // 2 + 1
    halfway = TrainingPlan(plan.iterations[:middle], plan.epsilons[:middle])
    resumed_dir, whole_dir = folder / "resumed", folder / "whole"
    for directory in (resumed_dir, whole_dir):
        directory.mkdir()
    generator.fit(TrainingJob(profile, setting, schema, rows, SECRET, resumed_dir), prepared.directory, halfway)
    resumed = generator.fit(
        TrainingJob(profile, setting, schema, rows, SECRET, resumed_dir), prepared.directory, plan
    ).ledger
    uninterrupted = generator.fit(
        TrainingJob(profile, setting, schema, rows, SECRET, whole_dir), prepared.directory, plan
    ).ledger
    _, other = _train(folder / "other", schema, second, profile, setting)
    return Trained(
        name,
        profile,
        setting,
        schema,
        plan,
        _ledger(trained["ledger"]),
        trained["checkpoints"],
        samples.directory,
        resumed,
        uninterrupted,
        public_outputs(other, profile, setting, schema),
    )


# ---------------------------------------------------------------------------------------------- checks


def check_plan_within_budget(t: Trained) -> None:
    budget = t.profile.budget_for(t.setting)
    assert all(e <= budget for e in t.plan.epsilons) and list(t.plan.epsilons) == sorted(t.plan.epsilons)
    # The accountant's figure: what training's own ledger records at each planned checkpoint.
    assert [e["iteration"] for e in t.ledger] == list(t.plan.iterations)
    assert [e["epsilon"] for e in t.ledger] == pytest.approx(list(t.plan.epsilons), rel=1e-12)
    if len(t.plan.iterations) >= 3:  # a budget between the last two checkpoints stops before the last
        tighter = (t.plan.epsilons[-2] + t.plan.epsilons[-1]) / 2
        profile = dataclasses.replace(t.profile, privacy=dataclasses.replace(t.profile.privacy, epsilon_budget=tighter))
        cut = get(t.name).plan(profile, dataclasses.replace(t.setting, epsilon_budget=None))
        assert cut.iterations == t.plan.iterations[:-1] and cut.epsilons == t.plan.epsilons[:-1]
        assert cut.stopped_by_budget and cut.epsilon <= tighter


def check_resume_equals_uninterrupted(t: Trained) -> None:
    def released(ledger):
        return [(e["iteration"], e["epsilon"], e["sha256"]) for e in ledger]

    assert released(t.resumed) == released(t.uninterrupted)
    assert released(t.uninterrupted) == [(e["iteration"], e["epsilon"], e["sha256"]) for e in t.ledger]


def check_sampler_equals_training_sampling(t: Trained, scratch: Path) -> None:
    encoder = TableEncoder(t.schema)
    for entry in t.ledger:
        blob = torch.load(t.checkpoints / entry["generator"], map_location="cpu", weights_only=False)
        blob["generator_type"] = t.name  # as the release writes it: the light loader then needs no hint
        released = scratch / f"released_{entry['iteration']:06d}.pt"
        torch.save(blob, released)
        sampler = load_sampler(released)
        seed = t.profile.seed * 1_000_003 + entry["iteration"]  # the sample stage's seed
        written = pd.read_parquet(t.samples / f"synthetic_{entry['iteration']:06d}.parquet")
        pd.testing.assert_frame_equal(sample_rows(sampler, encoder, SAMPLED_ROWS, seed), written)
        shares = encoder.level_shares(sampler.sample(training.LEVEL_SHARE_ROWS, entry["iteration"]))
        assert shares == entry["level_shares"]


def check_every_published_parameter_is_labelled(t: Trained) -> None:
    facts = get(t.name).privacy_facts(t.profile, t.setting)
    assert set(facts.parameters) <= set(facts.labels)
    summary = privacy_summary(t.profile, [t.setting], t.schema)
    published = {k for k, v in summary.items() if not isinstance(v, dict)}
    assert set(summary["labels"]) == published and set(facts.parameters) <= published
    assert all(isinstance(label, str) and label.strip() for label in summary["labels"].values())


def check_nothing_published_outside_the_scan(t: Trained) -> None:
    ours = {
        "plan": t.plan,
        "ledger": [(e["iteration"], e["epsilon"]) for e in t.ledger],
        "files": [public_file_entries(t.checkpoints / e["generator"]) for e in t.ledger],
        "facts": get(t.name).privacy_facts(t.profile, t.setting),
        "summary": privacy_summary(t.profile, [t.setting], t.schema),
    }
    assert ours == t.other_table


# ------------------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module", params=names())
def trained(request, tmp_path_factory, cardio_schema) -> Trained:
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        profile, setting = smoke_profile(request.param)
        return train_for_checks(
            request.param, profile, setting, cardio_schema, tmp_path_factory.mktemp(f"conformance-{request.param}")
        )
    finally:
        torch.set_num_threads(torch_threads)


def test_plan_stays_within_the_budget_at_the_accountants_epsilons(trained):
    check_plan_within_budget(trained)


def test_resume_releases_what_an_uninterrupted_run_releases(trained):
    check_resume_equals_uninterrupted(trained)


def test_the_light_sampler_gives_the_rows_the_sample_stage_wrote(trained, tmp_path):
    check_sampler_equals_training_sampling(trained, tmp_path)


def test_every_published_parameter_is_labelled(trained):
    check_every_published_parameter_is_labelled(trained)


def test_nothing_is_published_from_outside_the_public_profile(trained):
    check_nothing_published_outside_the_scan(trained)
