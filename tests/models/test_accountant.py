"""The GS-WGAN privacy accountant against the reference table (computed with autodp) and autodp's own get_eps."""

from __future__ import annotations

import functools
import itertools
import json
import math

import pytest
from autodp import rdp_acct, rdp_bank

from dpsynth.models.errors import ConfigError
from dpsynth.models.privacy.accountant import (
    MECHANISM,
    GSWGANAccountant,
    epsilon_for,
    epsilons_at,
    mechanism_name,
)

SIGMA = 1.07
BATCH = 32
DELTA = 1e-5
ITERATIONS = (1_000, 5_000, 10_000, 20_000, 40_000)

# Reference values: epsilon for sigma = 1.07, B = 32, delta = 1e-5 (computed with autodp).
TABLE = {
    250: (8.82, 23.78, 36.04, 60.56, 109.61),
    500: (4.11, 10.02, 14.99, 23.78, 36.04),
    750: (2.67, 6.31, 9.32, 13.95, 22.15),
    1000: (1.98, 4.62, 6.73, 9.99, 14.97),
    1500: (1.34, 2.99, 4.32, 6.30, 9.30),
}
CELLS = [(k, t, eps) for k, row in TABLE.items() for t, eps in zip(ITERATIONS, row, strict=False)]


@functools.cache
def _row(discriminators: int) -> dict[int, float]:
    return dict(zip(ITERATIONS, epsilons_at(discriminators, ITERATIONS, BATCH, SIGMA, DELTA), strict=False))


def _autodp_eps(discriminators: int, iterations: int, sigma: float = SIGMA, delta: float = DELTA) -> float:
    """GS-WGAN's own accounting code, verbatim in spirit: a fresh autodp accountant."""
    acct = rdp_acct.anaRDPacct()

    def func(x):
        return rdp_bank.RDP_gaussian({"sigma": sigma}, x)

    if discriminators == 1:
        acct.compose_mechanism(func, coeff=iterations * BATCH)
    else:
        acct.compose_subsampled_mechanism(func, 1 / discriminators, coeff=iterations * BATCH)
    return acct.get_eps(delta)


@pytest.mark.parametrize(("discriminators", "iterations", "expected"), CELLS)
def test_reference_table_cell(discriminators, iterations, expected):
    got = _row(discriminators)[iterations]
    assert got == pytest.approx(expected, rel=0.01)


def test_gs_wgan_default_anchor():
    # GS-WGAN's published default: K = 1000, T = 20,000, B = 32, sigma = 1.07 -> epsilon about 10.
    assert epsilon_for(1000, 20_000, BATCH, SIGMA, DELTA) == pytest.approx(9.99, rel=0.01)


@pytest.mark.parametrize(
    ("discriminators", "iterations", "sigma"),
    [(1000, 20_000, SIGMA), (250, 1_000, SIGMA), (1500, 7, SIGMA), (2, 100, SIGMA), (1000, 1, 5.0)],
)
def test_matches_autodp_get_eps(discriminators, iterations, sigma):
    ours = epsilon_for(discriminators, iterations, BATCH, sigma, DELTA)
    assert ours == pytest.approx(_autodp_eps(discriminators, iterations, sigma), rel=0.005)


@pytest.mark.parametrize("iterations", [1, 1_000])
def test_one_discriminator_is_the_plain_gaussian_mechanism(iterations):
    # Sampling probability 1: n-fold Gaussian, RDP n * a / (2 sigma^2); the continuous optimum of the
    # classic conversion is c + 2 sqrt(c log(1/delta)) with c = n / (2 sigma^2), attained at a > 1.
    c = iterations * BATCH / (2 * SIGMA**2)
    closed_form = c + 2 * math.sqrt(c * math.log(1 / DELTA))
    assert epsilon_for(1, iterations, BATCH, SIGMA, DELTA) == pytest.approx(closed_form, rel=1e-6)
    assert epsilon_for(1, iterations, BATCH, SIGMA, DELTA) == pytest.approx(_autodp_eps(1, iterations), rel=0.005)


def test_zero_iterations_is_zero():
    assert epsilon_for(1000, 0, BATCH, SIGMA, DELTA) == 0.0
    assert epsilons_at(1000, [0, 0], BATCH, SIGMA, DELTA) == [0.0, 0.0]
    assert GSWGANAccountant(1000, BATCH, SIGMA).get_epsilon(DELTA) == 0.0


def test_epsilons_at_is_monotone_and_matches_epsilon_for():
    checkpoints = list(range(0, 40_001, 1_000))  # 41 points, as a full run's checkpoints
    curve = epsilons_at(750, checkpoints, BATCH, SIGMA, DELTA)
    assert len(curve) == len(checkpoints)
    assert curve[0] == 0.0
    assert all(b >= a for a, b in itertools.pairwise(curve))
    for t in (1_000, 13_000, 40_000):
        assert curve[checkpoints.index(t)] == epsilon_for(750, t, BATCH, SIGMA, DELTA)


def test_epsilons_at_keeps_input_order():
    shuffled = [20_000, 1_000, 5_000, 1_000]
    got = epsilons_at(1000, shuffled, BATCH, SIGMA, DELTA)
    assert got == [epsilon_for(1000, t, BATCH, SIGMA, DELTA) for t in shuffled]


def test_step_accumulates_like_epsilon_for():
    acct = GSWGANAccountant(discriminators=500, batch_size=BATCH, noise_multiplier=SIGMA)
    acct.step()
    acct.step(999)
    acct.step(0)
    acct.step(4_000)
    assert acct.iterations == 5_000
    assert acct.compositions == 5_000 * BATCH
    assert acct.sample_rate == pytest.approx(1 / 500)
    assert acct.get_epsilon(DELTA) == epsilon_for(500, 5_000, BATCH, SIGMA, DELTA)
    assert acct.get_epsilon(DELTA) == pytest.approx(10.02, rel=0.01)


def test_state_dict_round_trip():
    acct = GSWGANAccountant(1500, BATCH, SIGMA)
    acct.step(3_000)
    state = json.loads(json.dumps(acct.state_dict()))
    assert state["mechanism"] == MECHANISM == acct.mechanism == mechanism_name("per_row")
    assert state["critic_draw"] == "per_row" and state["iterations"] == 3_000

    resumed = GSWGANAccountant(1500, BATCH, SIGMA)
    resumed.load_state_dict(state)
    assert resumed.iterations == 3_000
    assert resumed.get_epsilon(DELTA) == acct.get_epsilon(DELTA)
    resumed.step(1_000)
    assert resumed.get_epsilon(DELTA) == epsilon_for(1500, 4_000, BATCH, SIGMA, DELTA)

    rebuilt = GSWGANAccountant.from_state_dict(state)
    assert rebuilt.state_dict() == acct.state_dict()


@pytest.mark.parametrize(
    "change",
    [
        {"discriminators": 1000},
        {"batch_size": 64},
        {"noise_multiplier": 1.5},
        {"mechanism": "Poisson RDP"},
        {"critic_draw": "per_step", "mechanism": mechanism_name("per_step")},
    ],
)
def test_load_state_dict_rejects_a_different_mechanism(change):
    state = GSWGANAccountant(1500, BATCH, SIGMA).state_dict() | change
    with pytest.raises(ConfigError):
        GSWGANAccountant(1500, BATCH, SIGMA).load_state_dict(state)


@pytest.mark.parametrize(
    "state",
    [
        {"iterations": 5},
        GSWGANAccountant(1500, BATCH, SIGMA).state_dict() | {"iterations": -1},
        GSWGANAccountant(1500, BATCH, SIGMA).state_dict() | {"extra": 1},
        [("iterations", 5)],
    ],
)
def test_load_state_dict_rejects_malformed_state(state):
    with pytest.raises(ConfigError):
        GSWGANAccountant(1500, BATCH, SIGMA).load_state_dict(state)


@pytest.mark.parametrize(
    ("discriminators", "iterations", "batch_size", "sigma", "delta"),
    [
        (0, 1_000, BATCH, SIGMA, DELTA),
        (-5, 1_000, BATCH, SIGMA, DELTA),
        (2.5, 1_000, BATCH, SIGMA, DELTA),
        (1000, -1, BATCH, SIGMA, DELTA),
        (1000, 1.5, BATCH, SIGMA, DELTA),
        (1000, 1_000, 0, SIGMA, DELTA),
        (1000, 1_000, BATCH, 0.0, DELTA),
        (1000, 1_000, BATCH, -1.0, DELTA),
        (1000, 1_000, BATCH, math.inf, DELTA),
        (1000, 1_000, BATCH, math.nan, DELTA),
        (1000, 1_000, BATCH, SIGMA, 0.0),
        (1000, 1_000, BATCH, SIGMA, 1.0),
        (1000, 1_000, BATCH, SIGMA, -1e-5),
        (1000, 1_000, BATCH, SIGMA, 2.0),
    ],
)
def test_invalid_arguments_raise_config_error(discriminators, iterations, batch_size, sigma, delta):
    with pytest.raises(ConfigError):
        epsilon_for(discriminators, iterations, batch_size, sigma, delta)
    with pytest.raises(ConfigError):
        epsilons_at(discriminators, [iterations], batch_size, sigma, delta)


def test_per_step_draw_is_one_query_per_step_at_sigma_over_sqrt_b():
    """The thesis' shared critic: T compositions of the subsampled Gaussian at sigma / sqrt(B)."""
    for k, t in ((1000, 1), (1500, 50), (250, 3)):
        assert epsilon_for(k, t, BATCH, SIGMA, DELTA, "per_step") == pytest.approx(
            epsilon_for(k, t, 1, SIGMA / math.sqrt(BATCH), DELTA), rel=1e-12
        )
    acct = GSWGANAccountant(1000, BATCH, SIGMA, "per_step")
    acct.step(20_000)
    assert acct.compositions == 20_000 and acct.mechanism == mechanism_name("per_step")
    # The thesis' default run accounted for the mechanism it trains: hundreds of thousands, not 10.
    assert acct.get_epsilon(DELTA) > 1e5
    assert GSWGANAccountant(1000, BATCH, SIGMA).get_epsilon(DELTA) == 0.0
    with pytest.raises(ConfigError, match="critic draw"):
        GSWGANAccountant(1000, BATCH, SIGMA, "per_batch")


def test_invalid_arguments_on_the_accountant():
    with pytest.raises(ConfigError, match="discriminators"):
        GSWGANAccountant(0, BATCH, SIGMA)
    with pytest.raises(ConfigError, match="noise multiplier"):
        GSWGANAccountant(1000, BATCH, 0.0)
    with pytest.raises(ConfigError, match="batch size"):
        GSWGANAccountant(1000, 0, SIGMA)
    acct = GSWGANAccountant(1000, BATCH, SIGMA)
    with pytest.raises(ConfigError, match="iterations"):
        acct.step(-1)
    assert acct.iterations == 0
    with pytest.raises(ConfigError, match="delta"):
        acct.get_epsilon(0.0)
    with pytest.raises(ConfigError, match="iterations"):
        epsilons_at(1000, [1_000, -1], BATCH, SIGMA, DELTA)
