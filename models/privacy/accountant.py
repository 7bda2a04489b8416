"""Privacy accountant for GS-WGAN's sanitised generator updates.

Each sanitised row is a Gaussian mechanism with RDP alpha / (2 sigma^2) (noise 2 sigma C for
sensitivity 2 C under replace-one adjacency), seen through a critic drawn uniformly among K, each
critic trained on its own disjoint subset of the rows: a row reaches a query with probability 1/K.
How the B rows of a step compose depends on how their critics are drawn (`critic_draw`):

* "per_row" (what dpsynth trains by default): every sanitised row draws its own critic, independently.
  The B rows are B independent subsampled queries, so a step is B compositions at noise sigma:
  T * B compositions after T steps (what GS-WGAN's code and the thesis compute).
* "per_step" (the thesis' Algorithm 2, kept to reproduce it): one critic per step receives all B rows,
  so a row in that critic's subset moves all B rows at once. The step is ONE subsampled Gaussian
  mechanism on the stacked rows, sensitivity 2 C sqrt(B) against noise 2 sigma C per entry: noise
  multiplier sigma / sqrt(B), T compositions. Its epsilon is in the hundreds and more.

Each query is accounted with autodp's analytical RDP bound for subsampling without replacement (Wang,
Balle and Kasiviswanathan 2019, Theorem 9), which needs the base mechanism's RDP between the outputs
of the sampled subset and of any other: it holds here because every critic's clipped output is within
2C of every other's, whatever the data. The curve is converted to (epsilon, delta) with the classic
formula

    epsilon = min over alpha > 1 of  n * RDP(alpha) + log(1 / delta) / (alpha - 1),   n = compositions.

That is what `autodp.rdp_acct.anaRDPacct.get_eps` computes: it takes the best integer order on its grid
(alpha = 2 .. 100 unless the optimum sits on the edge), then refines over the continuous orders within
+-1 of it (bounded Brent search), where the RDP at a non-integer order is autodp's linear interpolation
of the cumulant generating function. This module uses the same autodp curve and the same search, but
builds the curve of ONE subsampled mechanism once per (K, noise) and scales it by n: RDP composes
linearly, so epsilon for many iteration counts (checkpoints) costs milliseconds each instead of a fresh
autodp accountant per count. The tests check the result against autodp's own `get_eps`, and against
the exact privacy loss of the mechanism the trainer runs (models/privacy/exact_loss.py).

Partition sizes do not enter: the critic draw is uniform over the K critics whatever their subset
sizes, so a row's chance of reaching a query is 1/K exactly.

With K = 1 the sampling probability is 1: the plain Gaussian mechanism composed n times.

A non-private run (no clipping, no noise) is not accounted here; callers report epsilon = infinity.
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Iterable
from typing import Literal

import numpy as np
from autodp import rdp_acct, rdp_bank
from scipy.optimize import minimize_scalar

from dpsynth.models.errors import ConfigError
from dpsynth.models.privacy.checks import check_extra_rho, is_int, is_real

CriticDraw = Literal["per_row", "per_step"]
CRITIC_DRAWS: tuple[CriticDraw, ...] = typing.get_args(CriticDraw)
_MECHANISMS = {
    "per_row": (
        "subsampled Gaussian, one critic drawn per sanitised row (probability 1/K), sampling without "
        "replacement (Wang et al. 2019), analytical RDP (autodp), T x B compositions"
    ),
    "per_step": (
        "subsampled Gaussian, one critic drawn per step for all B rows (thesis Algorithm 2): noise "
        "multiplier sigma / sqrt(B), sampling without replacement (Wang et al. 2019), analytical RDP "
        "(autodp), T compositions"
    ),
}
MECHANISM = _MECHANISMS["per_row"]


def mechanism_name(critic_draw: str) -> str:
    """The accountant's description of the mechanism it composes for a critic draw."""
    return _MECHANISMS[_check_critic_draw(critic_draw)]


# autodp's anaRDPacct default integer grid of orders (alpha = 1 .. 100).
_GRID_MAX_ORDER = 100
# Past the grid we look at orders 200, 400, ... up to this (autodp's m_lin_max); only reached for very
# large noise or very few compositions. Every order gives a valid bound, so stopping early stays sound.
_MAX_ORDER = 12_800


# ----------------------------------------------------------------------------------------- validation


def _check_discriminators(discriminators: object) -> int:
    if not is_int(discriminators) or int(discriminators) < 1:
        raise ConfigError(
            f"the number of discriminators K must be an integer >= 1 (sampling probability 1/K), got {discriminators!r}"
        )
    return int(discriminators)


def _check_batch_size(batch_size: object) -> int:
    if not is_int(batch_size) or int(batch_size) < 1:
        raise ConfigError(f"the batch size B must be an integer >= 1, got {batch_size!r}")
    return int(batch_size)


def check_noise_multiplier(noise_multiplier: object) -> float:
    """sigma as a float, or ConfigError (shared with models/privacy/dpsgd_accountant.py)."""
    if not is_real(noise_multiplier) or float(noise_multiplier) <= 0:
        raise ConfigError(
            f"the noise multiplier sigma must be a finite number > 0, got {noise_multiplier!r} "
            "(a run without noise is non-private: report epsilon = infinity instead of accounting it)"
        )
    return float(noise_multiplier)


def check_delta(delta: object) -> float:
    """delta as a float in (0, 1), or ConfigError (shared with models/privacy/dpsgd_accountant.py)."""
    if not is_real(delta) or not 0 < float(delta) < 1:
        raise ConfigError(f"delta must be a number strictly between 0 and 1, got {delta!r}")
    return float(delta)


def _check_critic_draw(critic_draw: object) -> str:
    if critic_draw not in CRITIC_DRAWS:
        raise ConfigError(f"the critic draw must be one of {', '.join(CRITIC_DRAWS)}, got {critic_draw!r}")
    return str(critic_draw)


def _query(batch_size: int, noise_multiplier: float, critic_draw: str) -> tuple[float, int]:
    """(noise multiplier of one query, queries per generator step) for a critic draw."""
    if critic_draw == "per_row":
        return noise_multiplier, batch_size
    return noise_multiplier / math.sqrt(batch_size), 1


def _check_iterations(iterations: object) -> int:
    if not is_int(iterations) or int(iterations) < 0:
        raise ConfigError(f"the number of generator iterations must be an integer >= 0, got {iterations!r}")
    return int(iterations)


# ------------------------------------------------------------------------------- the per-step RDP curve


class _Curve:
    """RDP of ONE sanitised row (one composition) as autodp computes it, for a given (K, sigma)."""

    def __init__(self, discriminators: int, noise_multiplier: float):
        prob = 1.0 / discriminators
        acct = rdp_acct.anaRDPacct()
        sigma = noise_multiplier

        def gaussian(alpha: float) -> float:
            return rdp_bank.RDP_gaussian({"sigma": sigma}, alpha)

        if discriminators == 1:
            acct.compose_mechanism(gaussian, coeff=1.0)
        else:
            acct.compose_subsampled_mechanism(gaussian, prob, coeff=1.0)
        self._acct = acct
        self.orders = np.arange(2, _GRID_MAX_ORDER + 1)
        self.rdp = np.asarray(acct.get_rdp(self.orders), dtype=float)

    def __call__(self, alpha: float) -> float:
        """RDP at any real order >= 1 (autodp's interpolation between integer orders)."""
        return float(self._acct.get_rdp([alpha])[0])


@functools.lru_cache(maxsize=64)
def _curve(discriminators: int, noise_multiplier: float) -> _Curve:
    return _Curve(discriminators, noise_multiplier)


def _epsilon(curve: _Curve, compositions: int, delta: float, extra_rho: float = 0.0) -> float:
    """Classic conversion of `compositions` x the curve plus `extra_rho` x alpha (a zCDP mechanism on the
    same rows, composed sequentially: the measured marginals), with autodp's get_eps search."""
    if compositions == 0 and extra_rho == 0:
        return 0.0
    log_inv_delta = math.log(1.0 / delta)
    n = float(compositions)

    def fun(alpha: float) -> float:
        if alpha <= 1:
            return math.inf
        return log_inv_delta / (alpha - 1) + n * curve(alpha) + extra_rho * alpha

    values = log_inv_delta / (curve.orders - 1) + n * curve.rdp + extra_rho * curve.orders
    best = int(np.argmin(values))
    if best < len(curve.orders) - 1:
        best_order = float(curve.orders[best])
        lower, upper = best_order - 1, best_order + 1
        fallback = float(values[best])
    else:
        # The optimum is at or beyond the edge of the integer grid: double the order while it helps.
        lower, order, fallback = float(curve.orders[-2]), float(curve.orders[-1]), float(values[-1])
        while order * 2 <= _MAX_ORDER:
            candidate = fun(order * 2)
            if not candidate < fallback:
                upper = order * 2
                break
            lower, order, fallback = order, order * 2, candidate
        else:
            upper = order
    result = minimize_scalar(fun, method="bounded", bounds=(lower, upper), options={"disp": False})
    eps = min(float(result.fun), fallback) if result.success else fallback
    return eps if math.isfinite(eps) else math.inf


# ----------------------------------------------------------------------------------------- public API


def epsilon_for(
    discriminators: int,
    iterations: int,
    batch_size: int,
    noise_multiplier: float,
    delta: float,
    critic_draw: str = "per_row",
    extra_rho: float = 0.0,
) -> float:
    """Epsilon at `delta` after `iterations` generator iterations (per_row: iterations * batch_size
    compositions at sigma; per_step: iterations compositions at sigma / sqrt(batch_size)), with
    `extra_rho` (replace-one zCDP of a mechanism on the same rows) added to the curve."""
    return epsilons_at(discriminators, [iterations], batch_size, noise_multiplier, delta, critic_draw, extra_rho)[0]


def epsilons_at(
    discriminators: int,
    iterations_list: Iterable[int],
    batch_size: int,
    noise_multiplier: float,
    delta: float,
    critic_draw: str = "per_row",
    extra_rho: float = 0.0,
) -> list[float]:
    """Epsilon for each iteration count in `iterations_list` (same order); the RDP curve is built once.
    `extra_rho`: the replace-one zCDP of a mechanism on the same rows (RDP alpha x rho), added order by
    order before the conversion (the measured marginals, models/marginals/release.py)."""
    k = _check_discriminators(discriminators)
    b = _check_batch_size(batch_size)
    sigma = check_noise_multiplier(noise_multiplier)
    d = check_delta(delta)
    draw = _check_critic_draw(critic_draw)
    counts = [_check_iterations(t) for t in iterations_list]
    extra = check_extra_rho(extra_rho)
    if not any(counts) and not extra:
        return [0.0] * len(counts)
    query_sigma, per_step = _query(b, sigma, draw)
    curve = _curve(k, query_sigma)
    cache: dict[int, float] = {}
    out = []
    for t in counts:
        if t not in cache:
            cache[t] = _epsilon(curve, t * per_step, d, extra)
        out.append(cache[t])
    return out


def training_rdp(
    discriminators: int,
    iterations: int,
    batch_size: int,
    noise_multiplier: float,
    critic_draw: str = "per_row",
    extra_rho: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP at each order) of training for `iterations` generator iterations, plus `extra_rho` x
    order (the measured marginals): the curve this module converts to epsilon, at the integer orders
    2 .. 100, for composing with other mechanisms' RDP (models/privacy/lifetime.py composes a table's releases)."""
    k = _check_discriminators(discriminators)
    b = _check_batch_size(batch_size)
    sigma = check_noise_multiplier(noise_multiplier)
    draw = _check_critic_draw(critic_draw)
    t = _check_iterations(iterations)
    query_sigma, per_step = _query(b, sigma, draw)
    curve = _curve(k, query_sigma)
    orders = curve.orders.astype(float)
    return orders, curve.rdp * float(t * per_step) + check_extra_rho(extra_rho) * orders


class GSWGANAccountant:
    """Opacus-like accountant: `step()` once per generator iteration, `get_epsilon(delta)` at any time."""

    def __init__(self, discriminators: int, batch_size: int, noise_multiplier: float, critic_draw: str = "per_row"):
        self.discriminators = _check_discriminators(discriminators)
        self.batch_size = _check_batch_size(batch_size)
        self.noise_multiplier = check_noise_multiplier(noise_multiplier)
        self.critic_draw = _check_critic_draw(critic_draw)
        self._iterations = 0

    @property
    def mechanism(self) -> str:
        return mechanism_name(self.critic_draw)

    @property
    def iterations(self) -> int:
        """Generator iterations accounted so far."""
        return self._iterations

    @property
    def sample_rate(self) -> float:
        """Sampling probability of each sanitised row's discriminator shard: 1/K."""
        return 1.0 / self.discriminators

    @property
    def compositions(self) -> int:
        """Subsampled Gaussian queries composed so far: iterations * batch_size (per_row) or iterations
        (per_step, each at noise multiplier sigma / sqrt(batch_size))."""
        return self._iterations * _query(self.batch_size, self.noise_multiplier, self.critic_draw)[1]

    def step(self, iterations: int = 1) -> None:
        """Account `iterations` generator iterations (each releases batch_size sanitised rows)."""
        self._iterations += _check_iterations(iterations)

    def get_epsilon(self, delta: float, extra_rho: float = 0.0) -> float:
        """Epsilon so far, with `extra_rho` (replace-one zCDP of a mechanism on the same rows) composed in."""
        return epsilon_for(
            self.discriminators,
            self._iterations,
            self.batch_size,
            self.noise_multiplier,
            delta,
            self.critic_draw,
            extra_rho,
        )

    def epsilon_curve(self, iterations_list: Iterable[int], delta: float) -> list[float]:
        """Epsilon this accountant would report after each of the given iteration counts."""
        return epsilons_at(
            self.discriminators,
            iterations_list,
            self.batch_size,
            self.noise_multiplier,
            delta,
            self.critic_draw,
        )

    def state_dict(self) -> dict:
        """A plain JSON-serialisable snapshot."""
        return {
            "mechanism": self.mechanism,
            "discriminators": self.discriminators,
            "batch_size": self.batch_size,
            "noise_multiplier": self.noise_multiplier,
            "critic_draw": self.critic_draw,
            "iterations": self._iterations,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the iteration count from `state_dict()` output.

        The mechanism and its parameters must match this accountant's: a history accounted under a
        different K, B or sigma cannot be continued by this one (it would under-report epsilon).
        """
        if not isinstance(state, dict):
            raise ConfigError(f"accountant state must be a mapping, got {type(state).__name__}")
        expected = self.state_dict()
        missing = sorted(set(expected) - set(state))
        unknown = sorted(set(state) - set(expected))
        if missing or unknown:
            raise ConfigError(f"accountant state has missing keys {missing} and unknown keys {unknown}")
        for key in ("mechanism", "discriminators", "batch_size", "noise_multiplier", "critic_draw"):
            if state[key] != expected[key]:
                raise ConfigError(
                    f"accountant state was recorded with {key} = {state[key]!r}, "
                    f"but this accountant has {expected[key]!r}"
                )
        self._iterations = _check_iterations(state["iterations"])

    @classmethod
    def from_state_dict(cls, state: dict) -> GSWGANAccountant:
        """A new accountant with the parameters and history of `state`."""
        try:
            acct = cls(state["discriminators"], state["batch_size"], state["noise_multiplier"], state["critic_draw"])
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"accountant state is malformed: {exc!r}") from None
        acct.load_state_dict(state)
        return acct

    def __repr__(self) -> str:
        return (
            f"GSWGANAccountant(discriminators={self.discriminators}, batch_size={self.batch_size}, "
            f"noise_multiplier={self.noise_multiplier}, critic_draw={self.critic_draw!r}, "
            f"iterations={self._iterations})"
        )


__all__ = ["CRITIC_DRAWS", "MECHANISM", "GSWGANAccountant", "epsilon_for", "epsilons_at", "mechanism_name"]
