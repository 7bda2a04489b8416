"""The public record of a release: built once from the decision, the profile and the ledger, guarded when
it is made, and rendered the same way into release.json, the notes and the registry's tags."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from dpsynth.models.config import Profile, Setting, load_profile
from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.privacy.release_choice import ReleaseDecision
from dpsynth.tasks.bundle import release_json
from dpsynth.tasks.public_release import Checkpoint, PublicRelease, build_public_release
from dpsynth.tasks.registry import release_description, release_tags
from dpsynth.tasks.report import write_public_release_notes
from tests.conftest import CARDIO_SCHEMA

LEDGER = [
    {"iteration": 0, "epsilon": 0.0, "generator": "generator_000000.pt"},
    {"iteration": 20, "epsilon": 3.5, "generator": "generator_000020.pt", "level_shares": {"gender": {}}},
    {"iteration": 40, "epsilon": 5.25, "generator": "generator_000040.pt"},
]


def make_release(
    schema,
    *,
    profile: Profile | None = None,
    iteration: int = 20,
    epsilon: float = 5.25,
    ledger: list[dict] = LEDGER,
    release_id: str = "cardio-test",
    measured: dict | None = None,
    rows: int | None = None,
) -> PublicRelease:
    """A release's record as the release flow builds it, from a hand-made DP decision."""
    profile = profile or load_profile("default", CARDIO_SCHEMA)
    if rows is not None:
        profile = dataclasses.replace(profile, release_rows=rows)
    decision = ReleaseDecision(
        iteration=iteration,
        approved=True,
        epsilon_training=float(ledger[-1]["epsilon"]),
        epsilon_choice=1.0,
        epsilon=epsilon,
        composition="parallel",
        candidates=len(ledger),
    )
    return build_public_release(
        release_id=release_id,
        model_name=f"{schema.name}-test",
        schema=schema,
        profile=profile,
        setting=profile.release_target(),
        decision=decision,
        ledger=ledger,
        measured=measured,
    )


@pytest.fixture(scope="module")
def record(cardio_schema) -> PublicRelease:
    return make_release(
        cardio_schema,
        measured={"marginals_count": 23, "marginals_noise_multiplier": 47.5, "marginals_selection_epsilon": None},
    )


def test_the_record_holds_what_the_release_publishes(record, cardio_schema):
    profile = load_profile("default", CARDIO_SCHEMA)
    assert (record.release_id, record.dataset, record.schema_version) == (
        "cardio-test",
        "cardio",
        cardio_schema.version,
    )
    assert (record.iteration, record.trained_iterations, record.epsilon) == (20, 40, 5.25)
    assert record.checkpoints == (Checkpoint(0, 0.0), Checkpoint(20, 3.5), Checkpoint(40, 5.25))
    assert record.delta == profile.privacy.delta and record.rows == profile.release_rows
    assert record.measured == {"marginals_count": 23, "marginals_noise_multiplier": 47.5}  # None left out
    assert record.code_version and record.privacy["delta"] == profile.privacy.delta
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.epsilon = 1.0


def test_every_rendering_shows_the_same_release(record, cardio_schema, tmp_path):
    published = release_json(record)
    tags = release_tags(record)
    description = release_description(record)
    notes = write_public_release_notes(
        tmp_path / "RELEASE_NOTES.md",
        record,
        title="t",
        schema=cardio_schema,
        synthetic_frame=make_demo_table(cardio_schema, 50, seed=3),
    ).read_text()
    json.dumps(published, allow_nan=False)
    assert published["epsilon"] == float(tags["epsilon"]) == 5.25 and "epsilon 5.25 at delta" in description
    assert published["chosen_checkpoint"] == {"iteration": 20, "epsilon": 3.5} and tags["iteration"] == "20"
    assert (
        published["accountant"]["parameters"]["T"] == 40 and tags["T"] == "40" and "iteration 20 of 40" in description
    )
    assert published["accountant"]["parameters"]["marginals_count"] == 23 and tags["marginals_count"] == "23"
    assert tags["code_version"] == record.code_version and tags["release_id"] == published["release_id"]
    assert "Setting k" in notes and "checkpoint at iteration 20: (epsilon, delta) = (5.250, 1e-05)" in notes
    assert "| 40 | 5.250 |" in notes and record.statement.covers in notes and record.statement.covers in description


def test_a_non_private_release_publishes_null_epsilon_and_no_noise(cardio_schema):
    profile = Profile(name="np", settings=(Setting("base", 1, private=False),))
    ledger = [{"iteration": 0, "epsilon": math.inf}, {"iteration": 10, "epsilon": math.inf}]
    record = make_release(cardio_schema, profile=profile, iteration=10, epsilon=math.inf, ledger=ledger)
    published = release_json(record)
    assert published["epsilon"] is None and published["private"] is False
    assert published["accountant"]["mechanism"] == "none (non-private)"
    json.dumps(published, allow_nan=False)
    tags = release_tags(record)
    assert tags["private"] == "false" and tags["epsilon"] == "inf" and tags["sigma"] == tags["C"] == "none"


def test_the_guard_refuses_real_data_keys_and_an_untrained_checkpoint(record, cardio_schema):
    scores_against_real_rows = (("measured", "continuous_quantile_tvd"), ("parameters", "fidelity_spearman"))
    for field, key in (
        ("parameters", "real_auc"),
        ("measured", "critic_loss"),
        ("privacy", "validation_rows"),
        *scores_against_real_rows,
    ):
        with pytest.raises(ValueError, match=key):
            dataclasses.replace(record, **{field: {**getattr(record, field), key: 1}})
    with pytest.raises(ValueError, match="settings.k10.imputation"):
        dataclasses.replace(record, privacy={**record.privacy, "settings": {"k10": {"imputation": 3}}})
    with pytest.raises(ValueError, match="iteration 7 is not in the training ledger"):
        make_release(cardio_schema, iteration=7)
