"""The measured marginals' cost in every accountant (models/marginals/release.py): the epsilon each
generator plans and records is its own accountant's conversion of training's curve PLUS the marginals'
(replace-one for GS-WGAN, add/remove-one before the group-privacy conversion for DP-SGD), recomputed
here from the curves themselves; zero noise is refused; a negligible measurement costs next to nothing."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dpsynth.models.config import Profile, Setting, load_profile
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators import get
from dpsynth.models.marginals.measure import MeasurementPlan
from dpsynth.models.marginals.release import ADD_REMOVE_ONE, REPLACE_ONE, marginals_rho, measurement_plan
from dpsynth.models.privacy.accountant import training_rdp
from dpsynth.models.privacy.lifetime import lifetime_cost
from dpsynth.tasks.decision import release_cost_of, statement_for
from tests.conftest import CARDIO_SCHEMA, ROOT

GENERATORS = ("gswgan", "dpcgan", "dpautogan")


def _with_marginals(profile: Profile, **keys) -> Profile:
    return dataclasses.replace(profile, marginals=dataclasses.replace(profile.marginals, enabled=True, **keys))


def _smoke(generator: str, **keys) -> tuple[Profile, Setting]:
    profile = _with_marginals(load_profile("smoke", CARDIO_SCHEMA), **keys).with_generator(generator)
    return profile, profile.release_target()


def _classic(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    return float(np.min(rdp + math.log(1.0 / delta) / (orders - 1.0)))


def _group_privacy(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """Replace-one epsilon from an add/remove-one curve: 2 eps(d) at the largest add/remove delta d with
    (1 + e^eps(d)) d <= delta, found by scanning log d (coarse, then finely past the last feasible point)
    rather than by the bisection under test."""

    def feasible_eps(log_d: np.ndarray) -> np.ndarray:
        eps = np.min(rdp[None, :] - log_d[:, None] / (orders[None, :] - 1.0), axis=1)
        return np.where((1.0 + np.exp(np.minimum(eps, 700.0))) * np.exp(log_d) <= delta, eps, np.inf)

    coarse = np.linspace(math.log(delta) - 30.0, math.log(delta / 2.0), 2001)
    last = int(np.nonzero(np.isfinite(feasible_eps(coarse)))[0].max())
    fine = np.linspace(coarse[last], coarse[min(last + 1, len(coarse) - 1)], 2001)
    return 2.0 * float(np.min(feasible_eps(fine)))


def _dpsgd_curve(profile: Profile, last: int) -> tuple[np.ndarray, np.ndarray]:
    """Opacus's add/remove-one curve of training to `last`, straight from its analysis."""
    from opacus.accountants.analysis.rdp import compute_rdp

    from dpsynth.models.privacy.dpsgd_accountant import ORDERS

    orders = np.asarray(ORDERS)
    if profile.generator == "dpcgan":
        c = profile.dpcgan
        phases = [(c.sample_rate, c.noise_multiplier, last)]
    else:
        from dpsynth.models.generators.dpautogan.adapter import phases_at

        phases = [(p.sample_rate, p.noise_multiplier, p.steps) for p in phases_at(profile, last)]
    rdp = sum(np.asarray(compute_rdp(q=q, noise_multiplier=s, steps=t, orders=list(orders))) for q, s, t in phases if t)
    return orders, rdp


def first_principles_epsilon(profile: Profile, setting: Setting, last: int, plan: MeasurementPlan) -> float:
    """Training's RDP to checkpoint `last` plus the measurement plan's, order by order, converted once:
    GS-WGAN's replace-one curve (autodp's integer orders 2..100, refined between them by the accountant:
    the accountant may only be lower, by little); DP-SGD's add/remove curve, then group privacy."""
    if profile.generator == "gswgan":
        gan = profile.gan
        orders, train = training_rdp(
            setting.discriminators, last, gan.batch_size, profile.privacy.noise_multiplier, gan.critic_draw
        )
        return _classic(orders, train + orders * plan.rho(REPLACE_ONE), profile.privacy.delta)
    orders, train = _dpsgd_curve(profile, last)
    return _group_privacy(orders, train + orders * plan.rho(ADD_REMOVE_ONE), profile.privacy.delta)


@pytest.mark.parametrize("generator", GENERATORS)
def test_plan_and_ledger_epsilon_is_the_conversion_of_the_summed_curves(generator, cardio_schema):
    profile, setting = _smoke(generator, rho=0.2, selections=2)
    plan = get(generator).plan(profile, setting)
    measured = measurement_plan(profile, cardio_schema)
    expected = first_principles_epsilon(profile, setting, plan.last, measured)
    if generator == "gswgan":  # the accountant refines the order between integers: lower, never above
        assert expected - 0.02 <= plan.epsilon <= expected + 1e-9
    else:
        assert plan.epsilon == pytest.approx(expected, rel=1e-5)
    training_only = (
        get(generator)
        .plan(dataclasses.replace(profile, marginals=dataclasses.replace(profile.marginals, enabled=False)), setting)
        .epsilon
    )
    # Composed, not added: more than training alone, and for GS-WGAN (one replace-one curve) less than
    # training plus the measurement's own epsilon.
    assert training_only < plan.epsilon
    if generator == "gswgan":
        assert plan.epsilon < training_only + measured.epsilon(profile.privacy.delta)


def test_the_measurement_spends_what_the_accountants_add(cardio_schema):
    for selections in (0, 3):
        profile, _ = _smoke("gswgan", rho=0.3, selections=selections)
        plan = measurement_plan(profile, cardio_schema)
        for adjacency in (REPLACE_ONE, ADD_REMOVE_ONE):
            assert plan.rho(adjacency) == pytest.approx(marginals_rho(profile, adjacency), rel=1e-12)
        # The marginals get what the selection rounds and the shapes (marginals.shape_share, 0.2) leave.
        left = 1.0 - (0.1 if selections else 0.0) - 0.2
        assert plan.noise_multipliers[0] == pytest.approx(
            math.sqrt((len(plan.marginals) + selections) / (2 * 0.3 * left)), rel=1e-12
        )
        # Each continuous column's fine histogram: 0.2 x 0.3 over the continuous columns, inside plan.rho.
        continuous = [c.name for c in cardio_schema.columns if c.is_continuous]
        assert plan.shape_columns == tuple(continuous) and continuous
        assert plan.shape_noise_multiplier == pytest.approx(math.sqrt(len(continuous) / (2 * 0.3 * 0.2)), rel=1e-12)


def test_zero_noise_is_refused_and_negligible_noise_costs_next_to_nothing(tmp_path):
    (tmp_path / "profiles").mkdir()
    for bad in (".inf", "0.0", "-1.0"):
        (tmp_path / "profiles" / "p.yaml").write_text(f"marginals: {{enabled: true, rho: {bad}}}\n")
        with pytest.raises(ConfigError, match="rho"):
            load_profile("p", tmp_path / "schema.yaml")
    with pytest.raises(ConfigError, match="noise multiplier"):
        MeasurementPlan((("a",),), (0.0,))
    for generator in GENERATORS:
        profile, setting = _smoke(generator, rho=1e-9)
        without = dataclasses.replace(profile, marginals=dataclasses.replace(profile.marginals, enabled=False))
        on, off = get(generator).plan(profile, setting).epsilon, get(generator).plan(without, setting).epsilon
        assert off < on < off + 0.01, generator


def test_lifetime_curve_of_a_gswgan_release_includes_the_marginals():
    profile, setting = _smoke("gswgan", rho=0.5)
    plan = get("gswgan").plan(profile, setting)
    cost = release_cost_of(profile, setting, plan.last, plan.epsilon)
    orders, curve = cost.rdp()
    t, choice = cost.training, cost.choice_epsilon
    _, train = training_rdp(t.discriminators, t.iterations, t.batch_size, t.noise_multiplier, t.critic_draw)
    # Training and the marginals read the training rows (their curves add); the choice reads others (max).
    assert t.marginals_rho == 0.5
    assert np.allclose(
        curve, np.maximum(train + orders * 0.5, np.minimum(choice, orders * choice**2 / 2)), rtol=1e-12, atol=0
    )
    assert np.all(curve > np.maximum(train, np.minimum(choice, orders * choice**2 / 2)))
    # One release composes to its own epsilon (up to the accountant's order refinement).
    assert lifetime_cost([cost]).epsilon == pytest.approx(plan.epsilon, abs=0.05)


def test_facts_and_statement_name_the_marginals():
    for generator in GENERATORS:
        profile, setting = _smoke(generator, rho=0.05, selections=1)
        facts = get(generator).privacy_facts(profile, setting)
        assert facts.parameters["marginals_rho"] == 0.05 and facts.parameters["marginals_selections"] == 1
        assert "measured marginals" in facts.accountant
        assert "the measured marginals" in statement_for(profile, setting, release=True).covers
        off = dataclasses.replace(profile, marginals=dataclasses.replace(profile.marginals, enabled=False))
        assert not any(k.startswith("marginals") for k in get(generator).privacy_facts(off, setting).parameters)


def test_calibrated_sampling_imports_no_accountant():
    # The pyfunc model samples in an environment without autodp or Opacus.
    script = textwrap.dedent("""
        import sys
        import dpsynth.models.marginals.calibration, dpsynth.models.generators.samplers, dpsynth.models.pyfunc
        heavy = ("autodp", "opacus", "dpsynth.models.privacy.accountant", "dpsynth.models.privacy.dpsgd_accountant")
        print(sorted(m for m in heavy if m in sys.modules))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"
