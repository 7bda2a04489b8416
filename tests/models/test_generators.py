"""The generator interface: the registry, each generator's plan against its own accountant, and the
epsilon its ledger records against the exact count of private updates its trainer ran."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from dpsynth.models.config import PrivacyConfig, Profile, Setting
from dpsynth.models.errors import BudgetExceededError, ConfigError
from dpsynth.models.generators import generator_for, get, names
from dpsynth.models.generators.base import TrainingJob
from dpsynth.models.generators.dpautogan.config import DPAutoGANConfig
from dpsynth.models.generators.dpcgan.config import DPCGANConfig
from dpsynth.models.generators.gswgan.config import GanConfig
from dpsynth.models.generators.samplers import load_sampler
from dpsynth.models.privacy.dpsgd_accountant import DPSGDAccountant, Phase, replace_one_epsilon
from dpsynth.models.privacy.secret import PrivacySecret
from tests.conftest import TEST_SECRET_HEX

SECRET = PrivacySecret.from_hex(TEST_SECRET_HEX)


def _profile(generator: str, budget: float | None = None, **sections) -> Profile:
    return Profile(
        name="t",
        generator=generator,
        settings=(Setting("s", 4),),
        privacy=PrivacyConfig(epsilon_budget=budget),
        gan=GanConfig(pretrain_iterations=2, iterations=6, checkpoint_every=3, batch_size=8),
        dpcgan=DPCGANConfig(
            **{"sample_rate": 0.05, "iterations": 6, "checkpoint_every": 3, **sections.get("dpcgan", {})}
        ),
        dpautogan=DPAutoGANConfig(
            **{
                "autoencoder_rate": 0.05,
                "critic_rate": 0.05,
                "autoencoder_steps": 4,
                "generator_steps": 4,
                "critic_steps": 2,
                "checkpoint_every": 2,
                **sections.get("dpautogan", {}),
            }
        ),
    )


def test_the_registry_finds_the_built_in_packages_and_each_profile_has_their_sections():
    assert {"gswgan", "dpcgan", "dpautogan"} <= set(names())
    assert {get(name).name for name in names()} == set(names())
    with pytest.raises(ConfigError, match="Unknown generator"):
        get("ctgan")
    profile = Profile(name="p")
    assert profile.section("gswgan") is profile.gan and profile.section("dpcgan") is profile.dpcgan
    assert isinstance(profile.dpautogan, DPAutoGANConfig) and profile.gan == GanConfig()
    # A section is a keyword of the constructor and of dataclasses.replace, validated as a profile file.
    shorter = dataclasses.replace(profile, gan=GanConfig(iterations=6, checkpoint_every=3))
    assert shorter.gan.iterations == 6 and shorter.dpcgan == profile.dpcgan
    with pytest.raises(ConfigError, match="gan.checkpoint_every: iterations \\(6\\) must be a multiple"):
        profile.gan.replace(iterations=6, checkpoint_every=4)
    with pytest.raises(ConfigError, match="gans: unknown key"):
        Profile(name="p", gans=GanConfig())


def test_a_setting_may_name_its_own_generator_and_budget():
    prof = dataclasses.replace(
        _profile("gswgan", budget=10.0),
        settings=(Setting("a", 4), Setting("b", generator="dpcgan", epsilon_budget=2.0)),
    )
    assert [generator_for(prof, s).name for s in prof.settings] == ["gswgan", "dpcgan"]
    assert [prof.budget_for(s) for s in prof.settings] == [10.0, 2.0]
    moved = prof.with_generator("dpautogan")
    assert {generator_for(moved, s).name for s in moved.settings} == {"dpautogan"}


def test_dpcgan_plans_with_its_own_accountant_and_stops_within_the_budget():
    prof = _profile("dpcgan", dpcgan={"iterations": 3000, "checkpoint_every": 500, "noise_multiplier": 1.5})
    plan = get("dpcgan").plan(prof, prof.settings[0])
    assert plan.iterations == tuple(range(0, 3001, 500))
    expected = [replace_one_epsilon(Phase(0.05, 1.5, t), 1e-5) for t in plan.iterations]
    assert plan.epsilons == pytest.approx(expected, rel=1e-12)
    budget = (expected[3] + expected[4]) / 2
    stopped = get("dpcgan").plan(
        dataclasses.replace(prof, privacy=PrivacyConfig(epsilon_budget=budget)), prof.settings[0]
    )
    assert stopped.last == 1500 and stopped.epsilon <= budget < expected[4] and stopped.stopped_by_budget
    with pytest.raises(BudgetExceededError, match="first trained checkpoint"):
        get("dpcgan").plan(
            dataclasses.replace(prof, privacy=PrivacyConfig(epsilon_budget=expected[1] / 2)), prof.settings[0]
        )


def test_dpautogan_plan_composes_both_phases_before_converting():
    prof = _profile("dpautogan")
    plan = get("dpautogan").plan(prof, prof.settings[0])
    assert plan.iterations == (0, 4, 6, 8)  # phase 1's inner checkpoints are not offered
    c = prof.dpautogan
    at_8 = replace_one_epsilon([Phase(0.05, c.autoencoder_noise, 4), Phase(0.05, c.critic_noise, 2 * 4)], 1e-5)
    assert plan.epsilon == pytest.approx(at_8, rel=1e-12)
    per_phase = replace_one_epsilon(Phase(0.05, c.autoencoder_noise, 4), 1e-5) + replace_one_epsilon(
        Phase(0.05, c.critic_noise, 8), 1e-5
    )
    assert plan.epsilon < per_phase  # one conversion of the summed RDP, never a sum of epsilons


def test_dp_sgd_generators_refuse_a_non_private_setting():
    for name in ("dpcgan", "dpautogan"):
        prof = dataclasses.replace(_profile(name), settings=(Setting("s", 4, private=False),))
        with pytest.raises(ConfigError, match="non-private baseline is GS-WGAN"):
            get(name).plan(prof, prof.settings[0])


def test_dpautogan_reconstruction_weights_come_from_the_schema(cardio_schema):
    from dpsynth.models.data.encoding import TableEncoder
    from dpsynth.models.generators.dpautogan.adapter import reconstruction_weights

    assert reconstruction_weights(_profile("dpautogan"), cardio_schema) is None  # the paper's plain sum
    prof = _profile("dpautogan", dpautogan={"continuous_weight": 10.0, "target_weight": 5.0})
    weights = reconstruction_weights(prof, cardio_schema)
    encoder = TableEncoder(cardio_schema)
    continuous = {b.start for b in encoder.blocks if b.column.kind == "continuous"}
    assert len(weights) == encoder.width and len(continuous) == 5
    for index, weight in enumerate(weights):
        expected = 5.0 if index == encoder.target_index else 10.0 if index in continuous else 1.0
        assert weight == expected


# "dpautogan-gaussian": DP-auto-GAN with the Gaussian latent model in place of the GAN; "dpautogan-moments":
# the same with the decoded-moment fit (one more query).
VARIANTS = {
    "dpautogan-gaussian": ("dpautogan", {"dpautogan": {"latent_model": "gaussian", "latent_noise": 5.0}}),
    "dpautogan-moments": (
        "dpautogan",
        {"dpautogan": {"latent_model": "gaussian", "latent_noise": 5.0, "moment_noise": 7.0, "moment_steps": 5}},
    ),
}


def _fit(tmp_path, name: str, cardio_schema, demo_frame):
    from dpsynth.models.data.encoding import TableEncoder

    name, sections = VARIANTS.get(name, (name, {}))
    prof = _profile(name, **sections)
    data = TableEncoder(cardio_schema).encode(demo_frame.iloc[:200]).astype(np.float32)
    generator = get(name)
    plan = generator.plan(prof, prof.settings[0])
    job = TrainingJob(prof, prof.settings[0], cardio_schema, data, SECRET, tmp_path)
    return prof, plan, generator.fit(job, tmp_path, plan), generator


@pytest.mark.parametrize("name", ["dpcgan", "dpautogan", "dpautogan-gaussian", "dpautogan-moments"])
def test_ledger_epsilon_is_the_replace_one_cost_of_the_updates_the_trainer_ran(
    tmp_path, name, cardio_schema, demo_frame
):
    _, plan, result, _ = _fit(tmp_path, name, cardio_schema, demo_frame)
    assert [e["iteration"] for e in result.ledger] == list(plan.iterations)
    # The trainer's own accountant, with one step per private update it actually ran:
    state = torch.load(tmp_path / "checkpoints" / "training_state.pt", weights_only=False)
    ran = DPSGDAccountant.from_state_dict(state["accountant"])
    steps = sum(p.steps for p in ran.phases)
    expected_steps = {"dpcgan": 6, "dpautogan": 4 + 2 * 4, "dpautogan-gaussian": 4 + 1, "dpautogan-moments": 4 + 2}[
        name
    ]
    assert steps == expected_steps
    if name == "dpautogan-gaussian":  # the fit is the Gaussian mechanism: a sampled Gaussian at rate 1, once
        assert [(p.sample_rate, p.noise_multiplier, p.steps) for p in ran.phases] == [(0.05, 2.0, 4), (1.0, 5.0, 1)]
        assert list(plan.iterations) == [0, 5]
    if name == "dpautogan-moments":  # and the moment query, another Gaussian mechanism
        assert [(p.sample_rate, p.noise_multiplier, p.steps) for p in ran.phases] == [
            (0.05, 2.0, 4),
            (1.0, 5.0, 1),
            (1.0, 7.0, 1),
        ]
    assert result.ledger[-1]["epsilon"] == pytest.approx(replace_one_epsilon(list(ran.phases), 1e-5), rel=1e-12)
    assert result.ledger[-1]["epsilon"] == pytest.approx(plan.epsilon, rel=1e-12)
    # The add/remove-one figure is kept beside it, never in its place.
    assert result.ledger[-1]["epsilon"] > result.ledger[-1]["epsilon_add_remove"]


@pytest.mark.parametrize("name", ["dpcgan", "dpautogan", "dpautogan-gaussian", "dpautogan-moments"])
def test_sampler_gives_the_trainers_own_sampling(tmp_path, name, cardio_schema, demo_frame):
    from dpsynth.models.generators.dpautogan import networks as dpautogan_networks
    from dpsynth.models.generators.dpautogan import sampler as dpautogan
    from dpsynth.models.generators.dpcgan import sampler as dpcgan

    _, _, result, generator = _fit(tmp_path, name, cardio_schema, demo_frame)
    path = tmp_path / "checkpoints" / result.ledger[-1]["generator"]
    rows = generator.load(path, result.ledger[-1]["sha256"]).sample(300, 7)
    if name == "dpcgan":
        gen, blob = dpcgan.load_generator(path)
        expected = dpcgan.sample_encoded(gen, 300, 7, label_prior=blob["spec"]["label_prior"])
    else:
        decoder, gen, blob = dpautogan.load_release(path)
        decoding = blob["spec"]["level_decoding"]
        assert decoding == "sample"  # the profile's default reaches the released file
        assert isinstance(gen, dpautogan_networks.GaussianLatent) == name.startswith("dpautogan-")
        expected = dpautogan.sample_encoded(decoder, gen, 300, 7, level_decoding=decoding)
    np.testing.assert_array_equal(rows, expected)
    # A released file names its generator; the light loader (the pyfunc model's) then needs no hint.
    blob = torch.load(path, weights_only=False)
    blob["generator_type"] = VARIANTS.get(name, (name,))[0]
    torch.save(blob, tmp_path / "released.pt")
    np.testing.assert_array_equal(load_sampler(tmp_path / "released.pt").sample(300, 7), expected)


class _LabelledToySampler:
    """A sampler of no built-in generator that takes the target's label: it says so itself."""

    marginals = None
    oversample = 1

    def sample(self, n_rows: int, seed: int) -> np.ndarray:
        return np.zeros((n_rows, 1), dtype=np.float32)

    def conditions_on_target(self) -> bool:
        return True

    def sample_with_label(self, n_rows: int, seed: int, label: int) -> np.ndarray:
        return np.full((n_rows, 1), float(label), dtype=np.float32)


class _PlainToySampler(_LabelledToySampler):
    def conditions_on_target(self) -> bool:
        return False


def test_a_sampler_says_itself_whether_it_conditions_on_the_target():
    # No list of sampler classes in samplers.py: a new generator's sampler conditions without an edit there.
    from dpsynth.models.generators.samplers import conditions_on_target, sample_with_label

    labelled = _LabelledToySampler()
    assert conditions_on_target(labelled)
    assert sample_with_label(labelled, 3, seed=0, label=1).tolist() == [[1.0]] * 3
    with pytest.raises(ValueError, match="label is 0 or 1"):
        sample_with_label(labelled, 3, seed=0, label=2)
    plain = _PlainToySampler()
    assert not conditions_on_target(plain)
    with pytest.raises(ValueError, match="rejection"):
        sample_with_label(plain, 3, seed=0, label=1)
    assert not conditions_on_target(object())  # a sampler that says nothing draws by rejection
