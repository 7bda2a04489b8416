"""The two mechanisms MST and AIM measure and select with, under REPLACE-ONE adjacency and zCDP, and the
conversion of a rho to (epsilon, delta).

* The Gaussian mechanism on a count vector: a replaced row takes one count from one cell and gives one
  to another, so the vector moves by L2 sqrt(2) (`L2_SENSITIVITY`); at noise std s it costs
  2 / (2 s^2) = 1 / s^2 zCDP.
* The exponential mechanism at epsilon e over scores of sensitivity D (MST's pair scores: an L1 distance
  between real counts and a function of earlier noisy outputs, D = 2, `SCORE_SENSITIVITY`): e-DP and
  e-bounded-range, so one choice costs e^2 / 8 zCDP (Cesar and Rogers 2021).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dpsynth.models.errors import BudgetExceededError

L2_SENSITIVITY = math.sqrt(2.0)
SCORE_SENSITIVITY = 2.0
# The conversion of a zCDP rho to (epsilon, delta) (models/marginals/measure.py `epsilon_of_rho`).
CONVERSION = "classic"


def gaussian_std(rho: float) -> float:
    """Noise std of the Gaussian mechanism on a count vector (L2 sensitivity sqrt(2)) that costs `rho`."""
    if not rho > 0:
        raise ValueError(f"rho must be > 0, got {rho!r}")
    return L2_SENSITIVITY / math.sqrt(2.0 * rho)


def gaussian_rho(std: float) -> float:
    """zCDP of that Gaussian mechanism at noise `std`: Delta^2 / (2 std^2) = 1 / std^2."""
    return L2_SENSITIVITY**2 / (2.0 * std**2)


def gaussian_counts(counts: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """The Gaussian mechanism on a count vector: each draw N(0, std^2) rounded to an integer, then added
    (post-processing of the draw, as models/marginals/measure.py `noisy_marginal` does: the floating-point
    bits of the sampler never reach the output)."""
    counts = np.asarray(counts, dtype=np.float64)
    return counts + np.rint(rng.normal(0.0, std, counts.shape))


def selection_probabilities(scores: np.ndarray, epsilon: float, sensitivity: float = SCORE_SENSITIVITY) -> np.ndarray:
    """The exponential mechanism's output distribution: softmax(epsilon u / (2 sensitivity))."""
    logits = epsilon * np.asarray(scores, dtype=np.float64) / (2.0 * sensitivity)
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def exponential_mechanism(
    scores: np.ndarray, epsilon: float, rng: np.random.Generator, sensitivity: float = SCORE_SENSITIVITY
) -> int:
    """One draw of the exponential mechanism by Gumbel-max: the argmax of epsilon u / (2 sensitivity) plus
    Gumbel noise, distributed as `selection_probabilities`."""
    logits = epsilon * np.asarray(scores, dtype=np.float64) / (2.0 * sensitivity)
    return int(np.argmax(logits + rng.gumbel(size=logits.shape)))


# ------------------------------------------------------------------------------------------ epsilon


def epsilon_of(rho: float, delta: float) -> float:
    """Replace-one (epsilon at `delta`) of a rho-zCDP mechanism (or of several on the same rows, their rhos
    added), by the project's RDP conversion."""
    from dpsynth.models.marginals.measure import epsilon_of_rho

    return epsilon_of_rho(rho, delta, CONVERSION)


@functools.lru_cache(maxsize=256)
def rho_for_epsilon(epsilon: float, delta: float, spent: float = 0.0) -> float:
    """The largest rho whose epsilon, with `spent` (the rho of other mechanisms on the same rows) added,
    stays within `epsilon`: bisection on log rho, as models/marginals/measure.py `plan_for_epsilon` does
    (the conversion is increasing in rho)."""
    if epsilon_of(spent + 1e-12, delta) > epsilon:
        raise BudgetExceededError(
            f"No MST fits epsilon {epsilon:g} at delta {delta:g}: the measured marginals alone (rho {spent:g}) "
            f"cost {epsilon_of(spent, delta):.4g}. Raise the budget, or lower marginals.rho."
        )
    low, high = math.log(1e-12), math.log(1e4)
    for _ in range(100):
        middle = (low + high) / 2.0
        if epsilon_of(spent + math.exp(middle), delta) <= epsilon:
            low = middle
        else:
            high = middle
    return math.exp(low)
