"""The DP-SGD accountant against the epsilons DP-CGAN and DP-auto-GAN publish.

Each published value is checked together with the mechanisms one could compose by mistake (two queries
per discriminator update, sampling without replacement, critic steps times generator steps, per-phase
conversion): the reference must accept ours and reject each of those, so a wrong mechanism fails here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from autodp import rdp_acct, rdp_bank

from dpsynth.models.errors import ConfigError
from dpsynth.models.privacy.dpsgd_accountant import (
    CONVERSIONS,
    MECHANISM,
    ORDERS,
    DPSGDAccountant,
    Phase,
    epsilon,
    rdp_curve,
)

DELTA = 1e-5  # both papers: DP-CGAN section 3.1/3.2, DP-auto-GAN section 5 ("we target delta = 10^-5")
INTEGER_ORDERS = range(2, 257)  # TF Privacy's integer orders: the recomputation at integer orders

# DP-CGAN: MNIST 60,000 rows, B = 600 (q = 0.01), 249 epochs = 24,900 updates, sigma = 1.15,
# published epsilon 9.6; Thyroid 3,772 training rows, B = 32, 50 epochs = 5,894 updates, published 3.7.
# One sanitised query per discriminator update (only the real part is noised).
MNIST = Phase(0.01, 1.15, 24_900)
THYROID = Phase(32 / 3_772, 1.15, 5_894)
DPCGAN = [  # (phases, printed in the paper, our integer-order recomputation)
    pytest.param(MNIST, 9.6, 9.64, id="mnist"),
    pytest.param(THYROID, 3.7, 3.72, id="thyroid"),
]

# DP-auto-GAN (the paper's appendix B.2 and Figs. 2-3): ADULT n = 32,561; autoencoder minibatches of 64 for
# 10,000 steps; critic minibatches of 128 for 15,000 steps (Fig. 3: T = 15,000 for the GAN);
# noise (autoencoder, critic) = (5, 8), (2.5, 7.5), (1.5, 3.5) for epsilon 0.36, 0.51, 1.01, which the
# paper rounds UP to two decimals.
ADULT_ROWS = 32_561


def _adult(noise_ae: float, noise_critic: float, critic_steps: int = 15_000) -> list[Phase]:
    return [Phase(64 / ADULT_ROWS, noise_ae, 10_000), Phase(128 / ADULT_ROWS, noise_critic, critic_steps)]


DPAUTOGAN = [  # (noise autoencoder, noise critic, printed, our recomputation)
    pytest.param(5.0, 8.0, 0.36, 0.35, id="eps-0.36"),
    pytest.param(2.5, 7.5, 0.51, 0.51, id="eps-0.51"),
    pytest.param(1.5, 3.5, 1.01, 1.01, id="eps-1.01"),
]


def _prints_as(eps: float, printed: float) -> bool:
    """DP-CGAN prints one decimal, rounded to nearest."""
    return round(eps, 1) == printed


def _rounds_up_to(eps: float, printed: float) -> bool:
    """DP-auto-GAN rounds up to two decimals ("rounded up to guarantee the validity")."""
    return math.ceil(round(eps * 100, 9)) / 100 == printed


def _without_replacement(phase: Phase) -> float:
    """The same query under sampling WITHOUT replacement (autodp, Wang et al. 2019), classic conversion."""
    acct = rdp_acct.anaRDPacct()
    acct.compose_subsampled_mechanism(
        lambda a: rdp_bank.RDP_gaussian({"sigma": phase.noise_multiplier}, a), phase.sample_rate, coeff=phase.steps
    )
    return acct.get_eps(DELTA)


# ------------------------------------------------------------------------------------ DP-CGAN


@pytest.mark.parametrize(("phase", "printed", "recomputed"), DPCGAN)
def test_dpcgan_reference(phase, printed, recomputed):
    assert _prints_as(epsilon(phase, DELTA), printed)
    assert epsilon(phase, DELTA, orders=INTEGER_ORDERS) == pytest.approx(recomputed, abs=0.005)
    # the finer default grid can only tighten the classic bound
    assert epsilon(phase, DELTA) <= epsilon(phase, DELTA, orders=INTEGER_ORDERS)


@pytest.mark.parametrize(("phase", "printed", "recomputed"), DPCGAN)
def test_dpcgan_reference_rejects_wrong_mechanisms(phase, printed, recomputed):
    # real and fake gradients counted (or noised) as two queries per discriminator update
    doubled = Phase(phase.sample_rate, phase.noise_multiplier, 2 * phase.steps)
    assert not _prints_as(epsilon(doubled, DELTA), printed)
    # a two-query-per-update accountant: two step() calls per update
    acct = DPSGDAccountant(phase.sample_rate, phase.noise_multiplier)
    for _ in range(2):
        acct.step(phase.steps)
    assert not _prints_as(acct.epsilon(DELTA), printed)
    # fixed-size batches drawn without replacement: a different mechanism with a different curve
    assert not _prints_as(_without_replacement(phase), printed)
    # the tighter conversion is not what the paper reports
    assert not _prints_as(epsilon(phase, DELTA, "opacus"), printed)


# -------------------------------------------------------------------------------- DP-auto-GAN


@pytest.mark.parametrize(("noise_ae", "noise_critic", "printed", "recomputed"), DPAUTOGAN)
def test_dpautogan_adult_reference(noise_ae, noise_critic, printed, recomputed):
    eps = epsilon(_adult(noise_ae, noise_critic), DELTA)
    assert _rounds_up_to(eps, printed)
    assert round(eps, 2) == recomputed


@pytest.mark.parametrize(("noise_ae", "noise_critic", "printed", "recomputed"), DPAUTOGAN)
def test_dpautogan_reference_rejects_wrong_accounting(noise_ae, noise_critic, printed, recomputed):
    phases = _adult(noise_ae, noise_critic)
    # 15 critic updates per generator update counted on top of the 15,000 critic steps
    assert not _rounds_up_to(epsilon(_adult(noise_ae, noise_critic, 15 * 15_000), DELTA), printed)
    # each critic update counted twice
    assert not _rounds_up_to(epsilon(_adult(noise_ae, noise_critic, 2 * 15_000), DELTA), printed)
    # a phase left out
    assert not _rounds_up_to(epsilon(phases[1], DELTA), printed)
    # Opacus's stock orders stop at 63, below these optima: never tighter than the extended grid
    assert epsilon(phases, DELTA, orders=ORDERS[:150]) >= epsilon(phases, DELTA)


@pytest.mark.parametrize(("noise_ae", "noise_critic", "printed", "recomputed"), DPAUTOGAN)
def test_lemma1_beats_converting_phases_separately(noise_ae, noise_critic, printed, recomputed):
    autoencoder, critic = _adult(noise_ae, noise_critic)
    separately = epsilon(autoencoder, DELTA / 2) + epsilon(critic, DELTA / 2)
    composed = epsilon([autoencoder, critic], DELTA)
    assert composed < separately
    assert not _rounds_up_to(separately, printed)


def test_opacus_conversion_matches_opacus_docstring_example():
    # opacus/accountants/analysis/rdp.py module docstring: (0.336, 23)
    phases = [Phase(1e-5, 1.0, 10), Phase(1e-4, 3.0, 4)]
    assert epsilon(phases, 1e-5, "opacus", orders=range(2, 33)) == pytest.approx(0.336, abs=5e-4)


def test_opacus_conversion_is_tighter():
    for phases in ([MNIST], [THYROID], _adult(2.5, 7.5)):
        assert epsilon(phases, DELTA, "opacus") < epsilon(phases, DELTA, "classic")


def test_no_subsampling_is_the_gaussian_mechanism():
    orders, rdp = rdp_curve(Phase(1.0, 2.0, 3))
    np.testing.assert_allclose(rdp, 3 * orders / (2 * 2.0**2))


def test_import_does_not_load_torch():
    code = "import sys, dpsynth.models.privacy.dpsgd_accountant; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# -------------------------------------------------------------------------------- composition


def test_identical_phases_compose_to_one_phase_with_summed_steps():
    q, sigma = 128 / ADULT_ROWS, 7.5
    _, split = rdp_curve([Phase(q, sigma, 6_000), Phase(q, sigma, 9_000)])
    _, whole = rdp_curve(Phase(q, sigma, 15_000))
    np.testing.assert_allclose(split, whole, rtol=1e-12)
    assert epsilon([Phase(q, sigma, 6_000), Phase(q, sigma, 9_000)], DELTA) == pytest.approx(
        epsilon(Phase(q, sigma, 15_000), DELTA), rel=1e-12
    )


def test_composed_curve_dominates_each_phase():
    autoencoder, critic = _adult(2.5, 7.5)
    orders, both = rdp_curve([autoencoder, critic])
    assert tuple(orders) == ORDERS
    np.testing.assert_allclose(both, rdp_curve(autoencoder)[1] + rdp_curve(critic)[1], rtol=1e-12)
    for phase in (autoencoder, critic):
        assert np.all(both >= rdp_curve(phase)[1])
        assert epsilon([autoencoder, critic], DELTA) >= epsilon(phase, DELTA)


def test_curve_on_another_grid_for_lifetime_composition():
    orders, rdp = rdp_curve(MNIST, orders=range(2, 101))
    np.testing.assert_array_equal(orders, np.arange(2, 101, dtype=float))
    full_orders, full = rdp_curve(MNIST)
    lookup = dict(zip(full_orders.tolist(), full.tolist(), strict=False))
    shared = [i for i, a in enumerate(orders.tolist()) if a in lookup]  # ORDERS skips 11
    assert len(shared) == 98
    np.testing.assert_allclose(rdp[shared], [lookup[orders[i]] for i in shared], rtol=1e-12)


def test_nothing_released_costs_nothing():
    assert epsilon([], DELTA) == 0.0
    assert epsilon(Phase(0.01, 1.15, 0), DELTA) == 0.0
    assert DPSGDAccountant(0.01, 1.15).epsilon(DELTA) == 0.0


# ------------------------------------------------------------------------------ stateful accountant


def test_accountant_counts_one_composition_per_update():
    acct = DPSGDAccountant(THYROID.sample_rate, THYROID.noise_multiplier)
    for _ in range(THYROID.steps):  # one call per discriminator update, real and fake parts together
        acct.step()
    assert acct.steps == THYROID.steps
    assert acct.phases == (THYROID,)
    assert acct.epsilon(DELTA) == epsilon(THYROID, DELTA)
    assert acct.epsilon(DELTA, "opacus") == epsilon(THYROID, DELTA, "opacus")


def test_accountant_phases_match_functional():
    autoencoder, critic = _adult(2.5, 7.5)
    acct = DPSGDAccountant(autoencoder.sample_rate, autoencoder.noise_multiplier)
    acct.step(4_000)
    acct.begin_phase(autoencoder.sample_rate, autoencoder.noise_multiplier)  # same query: same phase
    acct.step(6_000)
    acct.begin_phase(critic.sample_rate, critic.noise_multiplier)
    acct.step(critic.steps)
    assert acct.phases == (autoencoder, critic)
    assert acct.steps == 25_000
    assert acct.epsilon(DELTA) == epsilon([autoencoder, critic], DELTA)
    np.testing.assert_array_equal(acct.rdp_curve()[1], rdp_curve([autoencoder, critic])[1])


def test_state_dict_round_trip():
    autoencoder, critic = _adult(5.0, 8.0)
    acct = DPSGDAccountant(autoencoder.sample_rate, autoencoder.noise_multiplier)
    acct.step(autoencoder.steps)
    acct.begin_phase(critic.sample_rate, critic.noise_multiplier)
    acct.step(7_000)
    state = json.loads(json.dumps(acct.state_dict()))
    assert state["mechanism"] == MECHANISM == acct.mechanism

    restored = DPSGDAccountant.from_state_dict(state)
    assert restored.phases == acct.phases
    other = DPSGDAccountant(critic.sample_rate, critic.noise_multiplier)
    other.load_state_dict(state)
    assert other.phases == acct.phases
    for a in (acct, restored, other):
        a.step(8_000)
        assert a.epsilon(DELTA) == epsilon([autoencoder, critic], DELTA)


def test_load_state_refuses_another_query_or_mechanism():
    acct = DPSGDAccountant(0.01, 1.15)
    acct.step(10)
    state = acct.state_dict()
    with pytest.raises(ConfigError, match="noise multiplier"):
        DPSGDAccountant(0.01, 1.0).load_state_dict(state)
    with pytest.raises(ConfigError, match="another mechanism"):
        DPSGDAccountant(0.01, 1.15).load_state_dict({**state, "mechanism": "subsampled Gaussian, without replacement"})
    bad_states = [
        None,
        {"phases": state["phases"]},
        {**state, "iterations": 3},
        {**state, "phases": []},
        {**state, "phases": [{"sample_rate": 0.01, "noise_multiplier": 1.15}]},
        {**state, "phases": [{"sample_rate": 0.01, "noise_multiplier": 1.15, "steps": -1}]},
    ]
    for bad in bad_states:
        with pytest.raises(ConfigError):
            DPSGDAccountant(0.01, 1.15).load_state_dict(bad)
        with pytest.raises(ConfigError):
            DPSGDAccountant.from_state_dict(bad)


# --------------------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("sample_rate", "noise", "steps", "match"),
    [
        (0.0, 1.0, 1, "sample rate"),
        (1.5, 1.0, 1, "sample rate"),
        (math.nan, 1.0, 1, "sample rate"),
        ("0.01", 1.0, 1, "sample rate"),
        (True, 1.0, 1, "sample rate"),
        (0.01, 0.0, 1, "noise multiplier"),
        (0.01, -1.0, 1, "noise multiplier"),
        (0.01, math.inf, 1, "noise multiplier"),
        (0.01, None, 1, "noise multiplier"),
        (0.01, 1.0, -1, "steps"),
        (0.01, 1.0, 1.5, "steps"),
        (0.01, 1.0, True, "steps"),
    ],
)
def test_bad_phase(sample_rate, noise, steps, match):
    with pytest.raises(ConfigError, match=match):
        Phase(sample_rate, noise, steps)


def test_bad_arguments():
    for delta in (0, 1, -1e-5, math.nan, "1e-5", None):
        with pytest.raises(ConfigError, match="delta"):
            epsilon(MNIST, delta)
    with pytest.raises(ConfigError, match="conversion"):
        epsilon(MNIST, DELTA, "autodp")
    assert set(CONVERSIONS) == {"classic", "opacus"}
    for phases in ((0.01, 1.15, 100), [(0.01, 1.15, 100)], "phases", None, {"sample_rate": 0.01}):
        with pytest.raises(ConfigError, match="Phase"):
            epsilon(phases, DELTA)
        with pytest.raises(ConfigError, match="Phase"):
            rdp_curve(phases)
    for orders in ([], [1.0], [0.5, 2], [2, math.inf], 3, ["2"]):
        with pytest.raises(ConfigError, match="orders"):
            rdp_curve(MNIST, orders=orders)
    acct = DPSGDAccountant(0.01, 1.15)
    for updates in (-1, 0.5, None):
        with pytest.raises(ConfigError, match="updates"):
            acct.step(updates)
    with pytest.raises(ConfigError, match="sample rate"):
        acct.begin_phase(0, 1.15)
    with pytest.raises(ConfigError, match="noise multiplier"):
        DPSGDAccountant(0.01, 0)
    assert acct.steps == 0


def test_replace_one_epsilon_is_group_privacy_of_two_at_the_requested_delta():
    from dpsynth.models.privacy.dpsgd_accountant import replace_one_epsilon

    thyroid = Phase(32 / 3772, 1.15, 5894)
    delta = 1e-5
    replaced = replace_one_epsilon(thyroid, delta)
    # Valid at delta itself: at d = delta / (1 + e^(eps/2)) the add/remove mechanism is (eps/2, d)-DP, and
    # group privacy over a removal and an addition gives (eps, (1 + e^(eps/2)) d) = (eps, delta) ...
    used = replaced / 2.0
    assert epsilon(thyroid, delta / (1 + math.exp(used))) <= used + 1e-9
    # ... and not much looser than it needs to be: a slightly larger half-epsilon is not needed.
    assert epsilon(thyroid, delta / (1 + math.exp(used * 0.98))) > used * 0.98
    # ... so it costs more than twice the add/remove epsilon at delta, and not absurdly more.
    assert 2 * epsilon(thyroid, delta) < replaced < 2 * epsilon(thyroid, delta / 100)
    assert replace_one_epsilon(Phase(0.01, 1.0, 0), delta) == 0.0
    assert replace_one_epsilon(thyroid, delta, conversion="opacus") < replaced
