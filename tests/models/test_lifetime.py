"""Composition of a table's releases: one release costs what it published, several compose under RDP
to what the accountant gives for their training composed, never less than the basic bound allows."""

import math

import pytest

from dpsynth.models.config import load_profile
from dpsynth.models.generators import generator_for
from dpsynth.models.privacy.accountant import epsilon_for
from dpsynth.models.privacy.lifetime import (
    ReleaseCost,
    TrainingCurve,
    lifetime_cost,
)
from dpsynth.tasks.decision import planned_release_cost, release_cost_of
from tests.conftest import CARDIO_SCHEMA

K, T, B, SIGMA, DELTA = 1000, 2000, 32, 1.07, 1e-5


def _release(iterations=T, choice=1.0, disjoint=True, epsilon=None):
    curve = TrainingCurve(K, iterations, B, SIGMA, "per_row")
    training = epsilon_for(K, iterations, B, SIGMA, DELTA)
    total = epsilon if epsilon is not None else (max(training, choice) if disjoint else training + choice)
    return ReleaseCost(total, DELTA, curve, choice, disjoint)


def test_one_release_costs_what_it_published():
    cost = _release()
    lifetime = lifetime_cost([cost])
    assert lifetime.epsilon == cost.epsilon and lifetime.delta == DELTA and lifetime.releases == 1


def test_releases_of_one_accountant_compose_like_its_training_composed():
    # Two releases of T iterations whose choice is free (below training's RDP at every useful order) are
    # 2T iterations of the same mechanism: the accountant's epsilon for 2T at the summed delta, up to its
    # finer search over orders (the ledger converts on the integer orders, never lower).
    cost = _release(choice=1e-6)
    lifetime = lifetime_cost([cost, cost])
    reference = epsilon_for(K, 2 * T, B, SIGMA, 2 * DELTA)
    assert reference <= lifetime.epsilon <= reference * 1.01
    assert lifetime.epsilon < 2 * cost.epsilon == lifetime.basic_epsilon


def test_the_choice_counts_per_row_and_sequential_releases_add_it():
    small = _release(iterations=10, choice=5.0)  # the choice dominates a tiny training
    assert lifetime_cost([small]).epsilon == pytest.approx(5.0)
    assert lifetime_cost([small, small]).epsilon > 5.0
    joint = _release(choice=1.0, disjoint=False)
    assert lifetime_cost([joint]).epsilon == joint.epsilon > _release(choice=1.0).epsilon


def test_releases_without_a_curve_add_their_epsilon():
    other = ReleaseCost(2.0, 1e-6)
    cost = _release()
    combined = lifetime_cost([cost, other, cost])
    assert combined.epsilon == pytest.approx(lifetime_cost([cost, cost]).epsilon + 2.0)
    assert combined.delta == pytest.approx(2 * DELTA + 1e-6)
    assert lifetime_cost([cost, ReleaseCost(math.inf, DELTA)]).epsilon == math.inf
    assert lifetime_cost([]).epsilon == 0.0


def test_costs_survive_the_ledger_round_trip_and_plans_bound_releases():
    cost = _release()
    assert ReleaseCost.from_dict(cost.to_dict()) == cost
    profile = load_profile("default", CARDIO_SCHEMA)
    setting = profile.release_target()
    planned = planned_release_cost(profile, setting)
    assert planned.epsilon <= profile.privacy.epsilon_budget and planned.training.discriminators == 1000
    shorter = release_cost_of(profile, setting, 1000, epsilon_for(1000, 1000, 32, 1.07, 1e-5))
    assert lifetime_cost([shorter]).epsilon < lifetime_cost([planned]).epsilon


def test_the_default_release_plans_its_measured_marginals_into_the_budget():
    """`default` releases with measured marginals (issue 41 item 4): the plan the lifetime budget checks
    composes their rho with training, which therefore stops one checkpoint earlier, within the budget."""
    profile = load_profile("default", CARDIO_SCHEMA)
    planned = planned_release_cost(profile, profile.release_target())
    assert profile.marginals.enabled and planned.training.marginals_rho == profile.marginals.rho == 0.05
    assert planned.training.iterations == 19_000
    training_alone = epsilon_for(K, 19_000, B, SIGMA, DELTA)
    assert training_alone < planned.epsilon <= profile.privacy.epsilon_budget


@pytest.mark.parametrize(
    "name, generator, last", [("rdpcgan-eps1", "rdpcgan", 1_100), ("dpfedctgan-eps1", "dpfedctgan", 8)]
)
def test_the_seed_gans_eps1_profiles_release_with_measured_marginals_within_epsilon_1(name, generator, last):
    """RDP-CGAN's and DP-Fed-CTGAN's release profiles (issue 41 item 4): the plan composes the marginals'
    rho with training, which stops earlier (iteration 1,100 of RDP-CGAN, not 1,300; DP-Fed-CTGAN's round 8,
    not about 20), and the release costs at most 1."""
    profile = load_profile(name, CARDIO_SCHEMA)
    setting = profile.release_target()
    plan = generator_for(profile, setting).plan(profile, setting)
    assert profile.generator == generator and profile.marginals.enabled and profile.marginals.rho == 0.005
    assert plan.last == last and plan.epsilon <= 1.0
    assert planned_release_cost(profile, setting).epsilon <= profile.privacy.epsilon_budget == 1.0
