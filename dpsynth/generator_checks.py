"""The generator checks: what every registered generator must keep of the generator interface's promises
(models/generators/base.py), run through the real stages (tasks/training.py) at smoke size on generated
tables. A generator registered elsewhere (its own distribution, as the toy generator of
tests/flows/test_toy_generator.py) is held to the same ones, in the spirit of scikit-learn's
`parametrize_with_checks`:

    @pytest.fixture(scope="module")
    def trained(request, tmp_path_factory):
        profile, setting = smoke_profile(request.param, SCHEMA)
        return train_for_checks(request.param, profile, setting, schema, tmp_path_factory.mktemp("checks"))

    @parametrize_with_checks(["mygenerator"])
    def test_generator_check(trained, check):
        check(trained)

The checks (`CHECKS`), each a function of one `Trained` run:

* its plan stays within the budget, and every planned epsilon is what its trainer's ledger records;
* training to a middle checkpoint and then to the end releases what one uninterrupted run releases;
* its light sampler (the pyfunc model's path: a released file, no hint) gives the rows the sample stage
  wrote and the level shares the training ledger holds, for the same seeds;
* every parameter it publishes has a label, and so does every key of the privacy summary;
* what it publishes (plan, epsilons, privacy facts, summary, the generator file's public entries) is the
  same for two different training tables: it depends on public profile values only.

It drives the stages, so it sits above `dpsynth.tasks` (docs/extending.md, "Layers"), beside the flows.
Each generator sizes its smoke run in its own config (`SectionConfig.smoke`, `checks_smoke`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from dpsynth.models.config import Profile, Setting, load_profile
from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators import get, registration
from dpsynth.models.generators.base import TrainingJob, TrainingPlan
from dpsynth.models.generators.samplers import load_sampler, sample_rows
from dpsynth.models.privacy.secret import PrivacySecret, store
from dpsynth.tasks import training
from dpsynth.tasks.privacy_summary import privacy_summary

# A fixed secret: the checks compare runs, which must draw the same private randomness (never a release's).
SECRET = PrivacySecret.from_hex("5e" * 32)  # the tests' fixed secret (tests/conftest.py)
# Training rows of each run: enough for every generator's batches, few enough to stay fast.
ROWS = 600
SAMPLED_ROWS = 300


def _close(value: float, expected: float) -> bool:
    """Equal up to rounding: relative 1e-12 (absolute 1e-12 near zero), as the accountant's figure is."""
    return abs(value - expected) <= max(1e-12 * abs(expected), 1e-12)


@dataclass
class Trained:
    """One generator's runs for the checks: the stages on table A, a resumed fit, and table B's outputs. The
    train stage's run is the uninterrupted one the resumed fit is held to (no second uninterrupted fit: each
    fit of a federated generator starts its processes, the checks' largest cost)."""

    name: str
    profile: Profile
    setting: Setting
    schema: DatasetSchema
    plan: TrainingPlan
    ledger: list[dict]  # the train stage's ledger (level shares included)
    checkpoints: Path
    samples: Path  # the sample stage's folder
    folder: Path  # the runs' folder, where a check may write
    resumed: list[dict]  # ledger of a fit to a middle checkpoint, then to the end, in a folder of its own
    other_table: dict  # the public outputs of the same training on table B


def smoke_profile(name: str, config_path: str | Path) -> tuple[Profile, Setting]:
    """The smoke profile beside the schema `config_path` (the shipped `smoke`) with every private setting on
    `name` (its section sized by its own config: `SectionConfig.smoke`, then `checks_smoke`), and the setting a
    release trains."""
    profile = load_profile("smoke", config_path).with_generator(name)
    section = registration(name).section
    sizing = type(profile.sections[section]).checks_smoke
    if sizing:
        profile = dataclasses.replace(profile, **{section: profile.sections[section].replace(**sizing)})
    return profile, profile.release_target()


def _stage_inputs(folder: Path, schema: DatasetSchema, frame: pd.DataFrame) -> tuple[Path, Path, Path]:
    """The files the prepare stage reads: the table, its encoding, and the positions of its training rows."""
    folder.mkdir(parents=True, exist_ok=True)
    table, encoded, rows = folder / "table.parquet", folder / "encoded.npy", folder / "gan_rows.npy"
    frame.to_parquet(table, index=False)
    np.save(encoded, TableEncoder(schema).encode(frame).astype(np.float32))
    np.save(rows, np.arange(len(frame)))
    return table, encoded, rows


def _prepare(run_dir: Path, schema: DatasetSchema, frame: pd.DataFrame, profile: Profile, setting: Setting):
    run_dir.mkdir(parents=True, mode=0o700)
    store(run_dir, SECRET)
    table, encoded, rows = _stage_inputs(run_dir / "inputs", schema, frame)
    return training.prepare_stage(run_dir, schema, table, encoded, rows, profile, setting)


def _train(run_dir: Path, schema: DatasetSchema, frame: pd.DataFrame, profile: Profile, setting: Setting):
    prepared = _prepare(run_dir, schema, frame, profile, setting)
    return prepared, training.train_stage(run_dir, schema, prepared.directory, profile, setting)


def _fit_halfway_then_to_the_end(
    name: str, profile: Profile, setting: Setting, schema: DatasetSchema, prepared_dir: Path, folder: Path
) -> list[dict]:
    """The ledger of a fit in `folder` stopped at a middle checkpoint of the plan, then resumed to its end."""
    generator, plan = get(name), get(name).plan(profile, setting)
    rows, counts = training.prepared_rows(prepared_dir, schema, generator.mapped_rows)
    middle = len(plan.iterations) // 2 + 1
    halfway = TrainingPlan(plan.iterations[:middle], plan.epsilons[:middle])
    folder.mkdir()
    generator.fit(TrainingJob(profile, setting, schema, rows, SECRET, folder, counts=counts), prepared_dir, halfway)
    return generator.fit(
        TrainingJob(profile, setting, schema, rows, SECRET, folder, counts=counts), prepared_dir, plan
    ).ledger


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
    """Everything the checks read, for generator `name` under `profile` (two tables, three runs: the stages on
    each table, and on the first a fit stopped at a middle checkpoint, then resumed to the end)."""
    first, second = (make_demo_table(schema, ROWS, seed=seed) for seed in (11, 12))
    # The three fits are independent once table A is prepared (folders of their own, randomness from the fixed
    # secret, never a global generator). A fit that waits on processes of its own (a federation's) runs beside the
    # others, so that their waits overlap; any other runs alone, one after another.
    beside = (
        ThreadPoolExecutor(max_workers=2)
        if type(profile.sections[registration(name).section]).fit_waits_on_processes
        else None
    )

    def start(fn: Callable[..., Any], *args: Any) -> Future:
        if beside is not None:
            return beside.submit(fn, *args)
        done: Future = Future()
        done.set_result(fn(*args))
        return done

    try:
        prepared = _prepare(folder / "run", schema, first, profile, setting)
        other_run = start(_train, folder / "other", schema, second, profile, setting)
        resumed_fit = start(
            _fit_halfway_then_to_the_end, name, profile, setting, schema, prepared.directory, folder / "resumed"
        )
        trained = training.train_stage(folder / "run", schema, prepared.directory, profile, setting)
        samples = training.sample_stage(
            folder / "run", schema, trained["checkpoints"], trained["ledger"], SAMPLED_ROWS, profile, setting
        )
        resumed, (_, other) = resumed_fit.result(), other_run.result()
    finally:
        if beside is not None:
            beside.shutdown()
    plan = get(name).plan(profile, setting)
    return Trained(
        name,
        profile,
        setting,
        schema,
        plan,
        _ledger(trained["ledger"]),
        trained["checkpoints"],
        samples.directory,
        folder,
        resumed,
        public_outputs(other, profile, setting, schema),
    )


# ---------------------------------------------------------------------------------------------- checks


def check_plan_within_budget(t: Trained) -> None:
    budget = t.profile.budget_for(t.setting)
    assert budget is not None, "the checks train under a budget (the smoke profile's)"
    assert all(e <= budget for e in t.plan.epsilons) and list(t.plan.epsilons) == sorted(t.plan.epsilons)
    # The accountant's figure: what training's own ledger records at each planned checkpoint.
    assert [e["iteration"] for e in t.ledger] == list(t.plan.iterations)
    assert len(t.ledger) == len(t.plan.epsilons)
    assert all(_close(e["epsilon"], planned) for e, planned in zip(t.ledger, t.plan.epsilons, strict=True))
    if len(t.plan.iterations) >= 3:  # a budget between the last two checkpoints stops before the last
        tighter = (t.plan.epsilons[-2] + t.plan.epsilons[-1]) / 2
        profile = dataclasses.replace(t.profile, privacy=dataclasses.replace(t.profile.privacy, epsilon_budget=tighter))
        cut = get(t.name).plan(profile, dataclasses.replace(t.setting, epsilon_budget=None))
        assert cut.iterations == t.plan.iterations[:-1] and cut.epsilons == t.plan.epsilons[:-1]
        assert cut.stopped_by_budget and cut.epsilon <= tighter


def check_resume_equals_uninterrupted(t: Trained) -> None:
    def released(ledger):
        return [(e["iteration"], e["epsilon"], e["sha256"]) for e in ledger]

    # The train stage's run is the uninterrupted one: a fit in another folder, stopped at a middle checkpoint
    # and resumed, releases the very files it released (their hashes), at the same epsilons.
    assert released(t.resumed) == released(t.ledger)


def check_sampler_equals_training_sampling(t: Trained) -> None:
    encoder = TableEncoder(t.schema)
    scratch = t.folder / "released"
    scratch.mkdir(exist_ok=True)
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


Check = Callable[[Trained], None]
CHECKS: tuple[Check, ...] = (
    check_plan_within_budget,
    check_resume_equals_uninterrupted,
    check_sampler_equals_training_sampling,
    check_every_published_parameter_is_labelled,
    check_nothing_published_outside_the_scan,
)


def parametrize_with_checks(names: Iterable[str]) -> Any:
    """A pytest decorator: one test per (generator, check), with the check as `check` and the generator's name
    as the parameter of the caller's fixture `trained` (indirect, so a module-scoped `trained` trains each
    generator once for all its checks). Two parametrizations, not one over (name, check) pairs: pytest
    caches a scoped fixture by its parameter's index, and a pair's index would differ for every check."""
    import pytest  # the checks run under pytest; importing this module does not need it

    by_generator = pytest.mark.parametrize("trained", list(names), indirect=True)
    by_check = pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])

    def decorate(test: Any) -> Any:
        return by_generator(by_check(test))

    return decorate
