"""Exact privacy loss of the subsampled Gaussian mechanism: the check the RDP accountant is held to.

The accountant (models/privacy/accountant.py) bounds epsilon through RDP, which is an upper bound. This module
computes the hockey-stick divergence itself, numerically, for the worst-case pair of output
distributions of one sanitised query:

    P = (1 - q) N(0, 1) + q N(mu, 1)   against   Q = N(0, 1)        (and Q against P),

with q the probability that the query reaches the critic holding the changed row (1/K) and mu the
sensitivity in units of the noise's standard deviation (2C / (2 sigma C) = 1/sigma for one sanitised
row; sqrt(B)/sigma for B rows that share one critic). Every pair of neighbouring output distributions
of such a query is dominated by this pair: the clipped gradients of any two critics are within 2C of
each other, so the other critics' mixture can be taken as N(0, 1) at the changed critic's neighbour,
and the mixture's divergence then equals q times the base Gaussian's at a larger epsilon (Balle,
Barthe, Gaboardi 2018, "advanced joint convexity"). `n` independent queries compose as the n-fold
product of the pair, whose privacy loss is the sum of n independent copies.

One query (n = 1) has a closed form. For n > 1 the privacy loss distribution is discretised on a grid
and convolved (FFT), in both directions: `pessimistic=True` rounds every loss up and counts the
truncated tail as infinite loss, giving an upper bound on delta(epsilon) (so an upper bound on the
true epsilon); `pessimistic=False` rounds down and drops the tail, a lower bound. Their gap shrinks with
the grid (`grid`), about n * grid in epsilon.

Used by the tests (the accountant's epsilon for one step must not be below the exact one of the
mechanism the trainer runs) and by the privacy audit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import ndtr

# Standard deviations of N(0, 1) kept on each side before the tail is treated as infinite loss
# (pessimistic) or dropped (optimistic): its mass is below 1e-40.
_TAIL = 13.5


@dataclass(frozen=True)
class QueryMechanism:
    """What one generator step releases, in the accountant's terms.

    `queries`: independent subsampled Gaussian queries per step; `sampling_probability`: the chance
    that one query reaches the critic holding a given row; `sensitivity_ratio`: mu, the largest change
    of one query's output (2C, or 2C sqrt(B) for B rows through one critic) over its noise's standard
    deviation (2 sigma C).
    """

    queries: int
    sampling_probability: float
    sensitivity_ratio: float

    @classmethod
    def gswgan_step(
        cls, discriminators: int, batch_size: int, noise_multiplier: float, critic_draw: str
    ) -> QueryMechanism:
        """One GS-WGAN generator step: B queries of one row each when every sanitised row draws its own
        critic ("per_row"); one query of B stacked rows when the step draws one critic ("per_step",
        the thesis' Algorithm 2)."""
        q = 1.0 / discriminators
        if critic_draw == "per_row":
            return cls(batch_size, q, 1.0 / noise_multiplier)
        if critic_draw == "per_step":
            return cls(1, q, math.sqrt(batch_size) / noise_multiplier)
        raise ValueError(f"unknown critic draw {critic_draw!r}")

    def delta(self, epsilon: float, steps: int = 1, pessimistic: bool = True, grid: float = 1e-4) -> float:
        return hockey_stick(
            epsilon,
            self.sampling_probability,
            self.sensitivity_ratio,
            self.queries * steps,
            pessimistic=pessimistic,
            grid=grid,
        )

    def epsilon(self, delta: float, steps: int = 1, pessimistic: bool = True, grid: float = 1e-4) -> float:
        return epsilon_at(
            delta,
            self.sampling_probability,
            self.sensitivity_ratio,
            self.queries * steps,
            pessimistic=pessimistic,
            grid=grid,
        )


# ------------------------------------------------------------------------------------------ one query


def _log_ratio_threshold(epsilon: float, q: float, mu: float, sign: int) -> float | None:
    """x where the loss of P against Q, log((1 - q) + q exp(mu x - mu^2 / 2)), equals sign * epsilon
    (None where it never does: the loss stays above log(1 - q))."""
    t = (math.exp(sign * epsilon) - (1.0 - q)) / q
    if t <= 0:
        return None
    return (math.log(t) + mu * mu / 2.0) / mu


def _single_query_delta(epsilon: float, q: float, mu: float) -> float:
    """Closed-form hockey-stick divergence of one query, the larger of the two directions."""
    e = math.exp(epsilon)
    # P against Q: the loss is increasing in x, above epsilon for x > x1.
    x1 = _log_ratio_threshold(epsilon, q, mu, +1)
    if x1 is None:
        forward = 1.0 - e
    else:
        forward = (1.0 - q) * ndtr(-x1) + q * ndtr(mu - x1) - e * ndtr(-x1)
    # Q against P: the loss -L(x) is above epsilon for x < x2.
    x2 = _log_ratio_threshold(epsilon, q, mu, -1)
    backward = 0.0
    if x2 is not None:
        backward = ndtr(x2) - e * ((1.0 - q) * ndtr(x2) + q * ndtr(x2 - mu))
    return max(forward, backward, 0.0)


# ----------------------------------------------------------------------------- n queries: PLD + FFT


def _loss_pmf(q: float, mu: float, direction: int, grid: float, pessimistic: bool) -> tuple[int, np.ndarray, float]:
    """The privacy loss distribution of one query on the integer grid (loss = index * grid): (offset,
    masses, infinite mass). direction +1: P against Q (x ~ P); -1: Q against P (x ~ Q)."""
    lo, hi = -_TAIL, _TAIL + mu
    # Cells in x fine enough that the loss moves by much less than the grid across one cell.
    # (the loss's slope in x is at most mu)
    cells = int(min(4_000_000, max(20_000, (hi - lo) * mu / (grid / 8))))
    x = np.linspace(lo, hi, cells + 1)
    if direction > 0:
        cdf = (1.0 - q) * ndtr(x) + q * ndtr(x - mu)
        tail = (1.0 - q) * ndtr(-hi) + q * ndtr(mu - hi)  # beyond hi: huge positive loss
    else:
        cdf = ndtr(x)
        tail = ndtr(lo)  # below lo: huge positive loss
    mass = np.diff(cdf)
    with np.errstate(divide="ignore"):
        log_q = math.log(q) if q > 0 else -math.inf
        base = np.logaddexp(math.log1p(-q) if q < 1 else -math.inf, log_q + mu * x - mu * mu / 2.0)
    loss = base if direction > 0 else -base
    # Within a cell the loss is monotone: its largest value is at one end, its smallest at the other.
    ends = np.stack([loss[:-1], loss[1:]])
    value = ends.max(axis=0) if pessimistic else ends.min(axis=0)
    index = np.ceil(value / grid) if pessimistic else np.floor(value / grid)
    index = index.astype(np.int64)
    offset = int(index.min())
    masses = np.bincount(index - offset, weights=mass)
    return offset, masses, (tail if pessimistic else 0.0)


def _compose(offset: int, masses: np.ndarray, n: int) -> tuple[int, np.ndarray]:
    """The n-fold convolution of a distribution on the integer grid (FFT, exact up to rounding)."""
    if n == 1:
        return offset, masses
    size = n * (len(masses) - 1) + 1
    fft_size = 1 << (size - 1).bit_length()
    spectrum = np.fft.rfft(masses, fft_size) ** n
    out = np.fft.irfft(spectrum, fft_size)[:size]
    return n * offset, np.clip(out, 0.0, None)


def _composed_delta(epsilon: float, composed: tuple[tuple[int, np.ndarray], float], grid: float) -> float:
    (offset, masses), infinite = composed
    losses = (offset + np.arange(len(masses))) * grid
    above = losses > epsilon
    finite = float(np.sum(masses[above] * -np.expm1(epsilon - losses[above])))
    return finite + infinite


def _composed(
    q: float, mu: float, n: int, grid: float, pessimistic: bool, direction: int
) -> tuple[tuple[int, np.ndarray], float]:
    offset, masses, tail = _loss_pmf(q, mu, direction, grid, pessimistic)
    infinite = 1.0 - (1.0 - tail) ** n
    return _compose(offset, masses, n), infinite


def hockey_stick(
    epsilon: float,
    sampling_probability: float,
    sensitivity_ratio: float,
    compositions: int = 1,
    pessimistic: bool = True,
    grid: float = 1e-4,
) -> float:
    """delta(epsilon) of `compositions` independent subsampled Gaussian queries (see the module notes)."""
    q, mu, n = float(sampling_probability), float(sensitivity_ratio), int(compositions)
    if not (0 < q <= 1 and mu > 0 and n >= 1):
        raise ValueError("need 0 < sampling probability <= 1, sensitivity ratio > 0, compositions >= 1")
    if n == 1:
        return _single_query_delta(epsilon, q, mu)
    return max(_composed_delta(epsilon, _composed(q, mu, n, grid, pessimistic, d), grid) for d in (+1, -1))


def epsilon_at(
    delta: float,
    sampling_probability: float,
    sensitivity_ratio: float,
    compositions: int = 1,
    pessimistic: bool = True,
    grid: float = 1e-4,
) -> float:
    """The smallest epsilon >= 0 with delta(epsilon) <= delta."""
    q, mu, n = float(sampling_probability), float(sensitivity_ratio), int(compositions)
    if n == 1:

        def excess(eps: float) -> float:
            return _single_query_delta(eps, q, mu) - delta
    else:
        if not (0 < q <= 1 and mu > 0):
            raise ValueError("need 0 < sampling probability <= 1 and sensitivity ratio > 0")
        # The composed distributions do not depend on epsilon: build them once.
        both = [_composed(q, mu, n, grid, pessimistic, d) for d in (+1, -1)]

        def excess(eps: float) -> float:
            return max(_composed_delta(eps, c, grid) for c in both) - delta

    if excess(0.0) <= 0:
        return 0.0
    high = 1.0
    while excess(high) > 0:
        high *= 2.0
        if high > 1e6:
            return math.inf
    return brentq(excess, 0.0, high, xtol=1e-6, rtol=1e-9)


# ------------------------------------------------------------------------- two discrete distributions


def discrete_delta(epsilon: float, first: np.ndarray, second: np.ndarray) -> float:
    """The hockey-stick divergence of two distributions on the same finite outcomes (each a vector of
    probabilities), the larger of the two directions: what a mechanism with these two outputs on a pair
    of neighbouring inputs needs as delta at `epsilon`."""
    p, q = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1 or (p < 0).any() or (q < 0).any():
        raise ValueError("need two probability vectors of the same length")
    e = math.exp(epsilon)
    return float(max(np.clip(p - e * q, 0.0, None).sum(), np.clip(q - e * p, 0.0, None).sum(), 0.0))


def discrete_epsilon(delta: float, first: np.ndarray, second: np.ndarray) -> float:
    """The smallest epsilon >= 0 with `discrete_delta` <= delta: the exact epsilon of a mechanism whose
    outputs on a pair of neighbouring inputs are these two discrete distributions (an exponential
    mechanism's choice, for instance)."""

    def excess(eps: float) -> float:
        return discrete_delta(eps, first, second) - delta

    if excess(0.0) <= 0:
        return 0.0
    high = 1.0
    while excess(high) > 0:
        high *= 2.0
        if high > 1e6:
            return math.inf
    # Bisection, not a root finder: at delta 0 the divergence is 0 on a whole interval, and the smallest
    # epsilon of it is wanted.
    low = 0.0
    for _ in range(80):
        middle = (low + high) / 2.0
        if excess(middle) > 0:
            low = middle
        else:
            high = middle
    return high


__all__ = ["QueryMechanism", "discrete_delta", "discrete_epsilon", "epsilon_at", "hockey_stick"]
