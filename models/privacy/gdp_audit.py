"""A Gaussian-DP audit: a lower bound on mu from a distinguishing test's whole trade-off curve, and the
epsilon it implies (Dong, Roth and Su 2022; the tight audits of MST and AIM by Ganev, Annamalai and
Kulynych measure mu this way).

A mu-GDP mechanism bounds every test between two neighbouring inputs: its false negative rate at false
positive rate a is at least Phi(Phi^-1(1 - a) - mu). So a test that calls "first input" above threshold
t, with false positive rate FPR(t) and false negative rate FNR(t), shows

    mu >= Phi^-1(1 - FPR(t)) - Phi^-1(FNR(t)).

With both rates bounded from above (Clopper-Pearson, each at 1 - (1 - confidence) / 2) the right side is
a lower bound on mu that holds with `confidence`. Every point of a Gaussian trade-off curve shows the same
mu, and the symmetric point (false positive rate = false negative rate) shows it with the least variance:
the threshold is that point of a calibration half of the trials (among quantiles of its scores), and the
bound is computed on the other half, so the choice costs no confidence. (Taking the threshold whose
calibration bound is highest picks noise in a tail: on the same runs of MST's release audit, mu 0.110
against the symmetric point's 0.145.) The epsilon at delta of mu-GDP
(models/privacy/exact_loss.py: the Gaussian mechanism's) is the lower bound on epsilon this implies for a
mechanism whose trade-off curve is Gaussian (the audit's assumption, as in the published GDP audits);
the plain (epsilon, delta) bound of the same counts (models/privacy/audit.py `epsilon_from_rates`)
needs no assumption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from dpsynth.models.privacy.audit import clopper_pearson, epsilon_from_rates, gaussian_epsilon


@dataclass(frozen=True)
class GDPAudit:
    mu_lower_bound: float
    epsilon_lower_bound: float  # mu-GDP's epsilon at delta, of mu_lower_bound
    epsilon_lower_bound_no_assumption: float  # the (epsilon, delta) bound of the same test's counts
    threshold: float
    false_positive_rate: float
    false_negative_rate: float
    test_trials: int
    confidence: float


def mu_from_rates(fp: int, negatives: int, fn: int, positives: int, confidence: float) -> float:
    """The lower bound on mu from a test's counts (fp of `negatives` trials on the second input called
    first, fn of `positives` on the first called second), both rates bounded from above."""
    each = 1.0 - (1.0 - confidence) / 2.0
    _, fpr_hi = clopper_pearson(fp, negatives, each)
    _, fnr_hi = clopper_pearson(fn, positives, each)
    if fpr_hi >= 1.0 or fnr_hi >= 1.0:
        return 0.0
    return max(0.0, float(norm.ppf(1.0 - fpr_hi) - norm.ppf(fnr_hi)))


def _counts(first: np.ndarray, second: np.ndarray, threshold: float) -> tuple[int, int]:
    """(false negatives on the first input, false positives on the second) of "first above threshold"."""
    return int(np.sum(first <= threshold)), int(np.sum(second > threshold))


def gdp_audit(
    first: np.ndarray, second: np.ndarray, delta: float, confidence: float = 0.95, thresholds: int = 200
) -> GDPAudit:
    """The GDP audit of scores (higher: more likely the first input) of trials on each input: the
    threshold the symmetric point of the first halves (among `thresholds` quantiles of their scores), the
    bound computed on the second halves."""
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    cal_a, cal_b, test_a, test_b = a[: len(a) // 2], b[: len(b) // 2], a[len(a) // 2 :], b[len(b) // 2 :]
    candidates = np.unique(np.quantile(np.concatenate([cal_a, cal_b]), np.linspace(0.0, 1.0, thresholds + 1)))
    gaps = []
    for t in candidates:
        fn, fp = _counts(cal_a, cal_b, float(t))
        gaps.append(abs(fn / len(cal_a) - fp / len(cal_b)))
    best_threshold = float(candidates[int(np.argmin(gaps))])
    fn, fp = _counts(test_a, test_b, best_threshold)
    mu = mu_from_rates(fp, len(test_b), fn, len(test_a), confidence)
    plain = epsilon_from_rates(len(test_a) - fn, len(test_a), fp, len(test_b), delta, confidence)
    return GDPAudit(
        mu_lower_bound=mu,
        epsilon_lower_bound=gaussian_epsilon(mu, delta) if mu > 0 else 0.0,
        epsilon_lower_bound_no_assumption=plain,
        threshold=best_threshold,
        false_positive_rate=fp / len(test_b),
        false_negative_rate=fn / len(test_a),
        test_trials=min(len(test_a), len(test_b)),
        confidence=confidence,
    )


def gdp_mu_of(epsilon: float, delta: float) -> float:
    """The mu whose mu-GDP has exactly `epsilon` at `delta` (the mu an (epsilon, delta) claim implies for a
    Gaussian trade-off curve)."""
    low, high = 1e-6, 1.0
    while gaussian_epsilon(high, delta) < epsilon:
        high *= 2.0
    for _ in range(60):
        middle = (low + high) / 2.0
        if gaussian_epsilon(middle, delta) < epsilon:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0 if math.isfinite(epsilon) else math.inf
