"""The calibration audits' helpers for the two mechanisms MST and AIM share (graphical/mechanisms.py),
each called on a canary pair that moves its input by the whole replace-one sensitivity, without
subsampling; each generator's audit.py runs them at its own budget's scales (the statistics are
models/privacy/audit.py's).

Each is judged against the exact epsilon of what the budget says the step spends, computed apart from the
code under audit: a measurement charged rho is the Gaussian mechanism with mu = sqrt(2 rho)
(models/privacy/exact_loss.py); a selection at epsilon e over scores of sensitivity D draws candidate i
with probability softmax(e u / (2 D))_i, and the exact epsilon is that pair of discrete distributions'
(`discrete_epsilon`). The claim is the project's conversion of the step's rho (e^2 / 8 for a selection).
`halve_noise` (a check of the audit) halves the measurement's std, or the selection's sensitivity (which
halves its Gumbel noise against the scores), and the audit must then refute."""

from __future__ import annotations

import math
import time

import numpy as np

from dpsynth.models.generators.graphical.mechanisms import epsilon_of, exponential_mechanism, gaussian_counts
from dpsynth.models.privacy.audit import audit_secret, calibration_result, gaussian_epsilon
from dpsynth.models.privacy.exact_loss import discrete_epsilon

# Trials drawn per call where the function under audit takes a batch (the count vectors of many trials).
CHUNK = 100_000


def counts_audit(
    mechanism: str,
    first: np.ndarray,
    second: np.ndarray,
    std: float,
    rho_charged: float,
    trials: int,
    halve_noise: bool,
    delta: float,
    required: float | None,
    seed: int,
    **extra: object,
) -> dict:
    """`gaussian_counts` at `std` on the count vectors `first` and `second` (a replaced row: one count
    down, one up), `trials` per input, each scored by its projection on first - second. Exact: the
    Gaussian mechanism at the rho the budget charges, mu = sqrt(2 rho); the claim, its (epsilon, delta)."""
    started = time.perf_counter()
    diff = np.asarray(first, dtype=np.float64) - np.asarray(second, dtype=np.float64)
    run_std = std / 2.0 if halve_noise else std
    scores = {}
    for is_first, counts in ((True, first), (False, second)):
        rng = audit_secret(seed, mechanism, is_first, halve_noise).numpy(mechanism)
        parts, left = [], trials
        while left > 0:
            n = min(CHUNK, left)
            # gaussian_counts adds one draw per entry: a stack of n copies is n independent trials.
            noisy = gaussian_counts(np.broadcast_to(counts, (n, len(counts))), run_std, rng)
            parts.append(noisy @ diff)
            left -= n
        scores[is_first] = np.concatenate(parts)
    exact = gaussian_epsilon(math.sqrt(2.0 * rho_charged), delta)
    return calibration_result(
        mechanism,
        scores[True],
        scores[False],
        exact,
        epsilon_of(rho_charged, delta),
        delta,
        std,
        halve_noise,
        required,
        started,
        function="dpsynth.models.generators.graphical.mechanisms.gaussian_counts",
        rho_charged=rho_charged,
        exact_of="the Gaussian mechanism at the rho charged: mu = sqrt(2 rho)",
        **extra,
    )


def softmax_choice(scores: np.ndarray, epsilon: float, sensitivity: float) -> np.ndarray:
    """The exponential mechanism's distribution as its analysis states it, computed here apart from the
    code under audit: softmax(epsilon u / (2 sensitivity))."""
    logits = epsilon * np.asarray(scores, dtype=np.float64) / (2.0 * sensitivity)
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def selection_audit(
    mechanism: str,
    first: np.ndarray,
    second: np.ndarray,
    epsilon: float,
    sensitivity: float,
    trials: int,
    halve_noise: bool,
    delta: float,
    required: float | None,
    seed: int,
    **extra: object,
) -> dict:
    """`exponential_mechanism` at `epsilon` and `sensitivity` over the scores `first` and `second` (no
    candidate's score moving by more than its own bound), called once per trial. Each choice is scored by
    its log-likelihood ratio under the analysis' two distributions (the most powerful test). Exact: those
    distributions' epsilon; the claim, the project's conversion of e^2 / 8 (bounded range)."""
    started = time.perf_counter()
    p, q = softmax_choice(first, epsilon, sensitivity), softmax_choice(second, epsilon, sensitivity)
    ratio = np.log(p) - np.log(q)
    run_sensitivity = sensitivity / 2.0 if halve_noise else sensitivity
    scores = {}
    for is_first, values in ((True, first), (False, second)):
        rng = audit_secret(seed, mechanism, is_first, halve_noise).numpy(mechanism)
        chosen = np.fromiter(
            (exponential_mechanism(values, epsilon, rng, run_sensitivity) for _ in range(trials)), np.int64, trials
        )
        scores[is_first] = ratio[chosen]
    exact = discrete_epsilon(delta, p, q)
    return calibration_result(
        mechanism,
        scores[True],
        scores[False],
        exact,
        epsilon_of(epsilon**2 / 8.0, delta),
        delta,
        2.0 * sensitivity / epsilon,  # the Gumbel noise's scale, in score units
        halve_noise,
        required,
        started,
        function="dpsynth.models.generators.graphical.mechanisms.exponential_mechanism",
        selection_epsilon=epsilon,
        sensitivity=sensitivity,
        candidates=len(p),
        exact_of="this pair of choice distributions, softmax(epsilon u / (2 sensitivity)) (discrete_epsilon)",
        **extra,
    )
