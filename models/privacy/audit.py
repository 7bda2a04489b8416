"""Empirical privacy auditing: lower bounds on epsilon from a distinguishing experiment.

A mechanism that is (epsilon, delta)-DP bounds every test that tells two neighbouring inputs apart:
TPR <= e^epsilon FPR + delta and (1 - FPR) <= e^epsilon (1 - TPR) + delta. Running a test many times on
both inputs and bounding its true and false positive rates with Clopper-Pearson intervals turns an
observed advantage into a lower bound on epsilon that holds with the stated confidence (Jagielski,
Ullman and Oprea 2020; Nasr et al. 2021). If the bound exceeds what an accountant claims, the claim is
false (with that confidence).

The threshold of the test is chosen on a calibration half of the trials and the bound is computed on
the other half, so choosing it costs no confidence.

This module is the machinery only (it imports no generator): each audit lives beside what it audits
(a generator package's audit.py, models/marginals/audit.py) and the audit table lists them all
(models/generators/audit_table.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import beta

from dpsynth.models.privacy.secret import PrivacySecret


def clopper_pearson(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Two one-sided bounds on a binomial rate, each holding with probability `confidence`."""
    alpha = 1.0 - confidence
    lower = 0.0 if successes == 0 else float(beta.ppf(alpha, successes, trials - successes + 1))
    upper = 1.0 if successes == trials else float(beta.ppf(1.0 - alpha, successes + 1, trials - successes))
    return lower, upper


def epsilon_from_rates(
    tp: int, positives: int, fp: int, negatives: int, delta: float, confidence: float = 0.95
) -> float:
    """The epsilon lower bound implied by a test's counts (tp of `positives` trials on the first input
    called positive, fp of `negatives` on the second): both rates bounded at confidence
    1 - (1 - confidence) / 2 each, so the bound holds with `confidence`."""
    each = 1.0 - (1.0 - confidence) / 2.0
    tpr_lo, _ = clopper_pearson(tp, positives, each)
    _, fpr_hi = clopper_pearson(fp, negatives, each)
    bounds = [0.0]
    if fpr_hi > 0 and tpr_lo - delta > 0:
        bounds.append(math.log((tpr_lo - delta) / fpr_hi))
    # The complementary test (call the second input when the score is low): TNR = 1 - FPR against
    # FNR = 1 - TPR, with TNR bounded from below and FNR from above.
    if 1.0 - tpr_lo > 0 and (1.0 - fpr_hi) - delta > 0:
        bounds.append(math.log(((1.0 - fpr_hi) - delta) / (1.0 - tpr_lo)))
    return max(bounds)


@dataclass(frozen=True)
class AuditResult:
    epsilon_lower_bound: float
    statistic: str
    threshold: float
    true_positives: int
    false_positives: int
    trials_per_input: int
    confidence: float


def _calibrate(a: np.ndarray, b: np.ndarray, delta: float, confidence: float) -> tuple[float, float]:
    """(bound, threshold) of the best threshold on calibration scores."""
    candidates = np.unique(np.concatenate([a, b]))
    if len(candidates) > 2000:
        candidates = np.unique(np.quantile(candidates, np.linspace(0.0, 1.0, 2001)))
    best, best_threshold = -1.0, float(candidates[-1]) if len(candidates) else 0.0
    sorted_a, sorted_b = np.sort(a), np.sort(b)
    for threshold in candidates:
        tp = len(a) - int(np.searchsorted(sorted_a, threshold, side="right"))
        fp = len(b) - int(np.searchsorted(sorted_b, threshold, side="right"))
        value = epsilon_from_rates(tp, len(a), fp, len(b), delta, confidence)
        if value > best:
            best, best_threshold = value, float(threshold)
    return best, best_threshold


def audit_scores(
    statistics: dict[str, tuple[np.ndarray, np.ndarray]], delta: float, confidence: float = 0.95
) -> AuditResult:
    """Lower bound from test scores: for each statistic, scores of trials on the first input (higher:
    more likely the first) and on the second. The statistic and its threshold are chosen on the first
    half of the trials; the bound is computed on the other half only."""
    best: tuple[float, str, float, np.ndarray, np.ndarray] | None = None
    for name, (first, second) in statistics.items():
        a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
        bound, threshold = _calibrate(a[: len(a) // 2], b[: len(b) // 2], delta, confidence)
        if best is None or bound > best[0]:
            best = (bound, name, threshold, a[len(a) // 2 :], b[len(b) // 2 :])
    if best is None:
        raise ValueError("no statistic to audit")
    _, name, threshold, test_a, test_b = best
    tp, fp = int((test_a > threshold).sum()), int((test_b > threshold).sum())
    bound = epsilon_from_rates(tp, len(test_a), fp, len(test_b), delta, confidence)
    return AuditResult(bound, name, threshold, tp, fp, min(len(test_a), len(test_b)), confidence)


def mixture_log_likelihood_ratio(
    projections: np.ndarray, probability: float, shift: float, noise_std: float, shared: bool
) -> np.ndarray:
    """Log-likelihood ratio of "some queries came from the shifted critic" for sanitised rows projected
    on the shift's direction, [trials, steps, rows]: under the second input every row is N(-shift/2,
    s^2); under the first, with probability q a query's rows are N(+shift/2, s^2) instead, each row on
    its own (`shared` False: a critic per row) or all rows of a step together (`shared` True)."""
    z = projections * (shift / noise_std**2)  # log N(+)/N(-) of each row
    log_keep, log_q = math.log1p(-probability), math.log(probability)
    if shared:
        per_step = np.logaddexp(log_keep, log_q + z.sum(axis=2))
        return per_step.sum(axis=1)
    return np.logaddexp(log_keep, log_q + z).sum(axis=(1, 2))


# ------------------------------------------------------------------------------- calibration audits
#
# One sanitised query at a time, without subsampling, on a canary pair whose outputs differ by the whole
# sensitivity: the exact epsilon is then a Gaussian mechanism's (mu = difference / noise std), and the
# events that carry it have probability 1e-4 to 1e-3 rather than 1e-5, so 10^6 trials per input show
# most of it. A bound above the exact epsilon means the code adds less noise (or clips less) than the
# analysis assumes: `halve_noise` runs each mechanism at half its noise multiplier while it is judged
# against the exact epsilon of the intended one, and the audit must then refute it.


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon at `delta` of the Gaussian mechanism whose two outputs are mu noise standard
    deviations apart (models/privacy/exact_loss.py at sampling probability 1)."""
    from dpsynth.models.privacy.exact_loss import epsilon_at

    return epsilon_at(delta, 1.0, mu)


def noise_run(noise_multiplier: float, halve_noise: bool) -> float:
    return noise_multiplier / 2.0 if halve_noise else noise_multiplier


def calibration_result(
    mechanism: str,
    first: np.ndarray,
    second: np.ndarray,
    exact: float,
    claimed: float,
    delta: float,
    noise_multiplier: float,
    halve_noise: bool,
    required: float | None,
    started: float,
    **extra: object,
) -> dict:
    """The audit of scores (higher: more likely the first input), judged against the exact epsilon: with
    the intended noise the bound must lie in [required, exact] (and the claim cover the exact epsilon);
    with half the noise it must exceed the exact epsilon. `required` None: 0.6 x the exact epsilon."""
    if required is None:
        required = 0.6 * exact
    result = audit_scores({"projection": (first, second)}, delta)
    bound = result.epsilon_lower_bound
    passed = bound > exact if halve_noise else required <= bound <= exact <= claimed
    n = result.trials_per_input
    return {
        "mechanism": mechanism,
        "epsilon_exact": round(exact, 4),
        "epsilon_claimed": round(claimed, 4),
        "epsilon_lower_bound": round(bound, 4),
        "trials": int(min(len(first), len(second))),
        "passed": bool(passed),
        "required_bound": None if halve_noise else round(required, 4),
        "halve_noise": halve_noise,
        "noise_multiplier": noise_multiplier,
        "noise_multiplier_run": noise_run(noise_multiplier, halve_noise),
        "exceeds_exact": bool(bound > exact),
        "claim_refuted": bool(bound > claimed),
        "threshold": round(result.threshold, 6),
        "test_trials": n,
        "true_positives": result.true_positives,
        "false_positives": result.false_positives,
        "tpr": result.true_positives / n,
        "fpr": result.false_positives / n,
        "confidence": result.confidence,
        "delta": delta,
        **extra,
        "seconds": round(time.perf_counter() - started, 1),
    }


def audit_secret(seed: int, mechanism: str, first: bool, halve_noise: bool) -> PrivacySecret:
    tag = int.from_bytes(mechanism.encode()[:8].ljust(8, b"\0"), "big")
    return PrivacySecret.from_hex(f"{seed:016x}{tag:016x}{int(first):016x}{int(halve_noise):016x}")


def dpsgd_pair_note(canaries: int) -> str:
    return (
        f"{canaries} canaries per call, each in its own gradient coordinates (its trial reads only its own "
        "entries of the released gradient, which no other canary touches): one call, that many trials"
    )


@dataclass(frozen=True)
class Calibration:
    """The settings every calibration audit shares: `trials` per input, whether the mechanism runs at
    half its `noise_multiplier` (`halve_noise`), the public `seed` (the secret derives from it), the
    `delta` the epsilons are stated at and the bound `required` of the intended noise (None: 0.6 x
    the exact epsilon)."""

    trials: int = 1_000_000
    halve_noise: bool = False
    seed: int = 0
    noise_multiplier: float = 2.14
    delta: float = 1e-5
    required: float | None = None

    @property
    def sigma(self) -> float:
        """The noise multiplier the mechanism runs at (half the intended one with `halve_noise`)."""
        return noise_run(self.noise_multiplier, self.halve_noise)

    def secret(self, mechanism: str, first: bool) -> PrivacySecret:
        return audit_secret(self.seed, mechanism, first, self.halve_noise)

    def result(
        self,
        mechanism: str,
        scores: Callable[[bool], np.ndarray],
        exact: float,
        claimed: float,
        started: float,
        **extra: object,
    ) -> dict:
        """`calibration_result` of the trials `scores(first)` on the first input, then the second."""
        first, second = scores(True), scores(False)
        return calibration_result(
            mechanism,
            first,
            second,
            exact,
            claimed,
            self.delta,
            self.noise_multiplier,
            self.halve_noise,
            self.required,
            started,
            **extra,
        )


@dataclass(frozen=True)
class UpdateAudit(Calibration):
    """A calibration audit of one DP-SGD update (each generator's `*_update_audit`):
    `canaries_per_call` canaries, each on coordinates of the released gradient no other row touches, so
    one call gives that many trials, beside `background_rows` public rows; a canary's gradient has norm
    `canary_norm` C, so the clip at C acts. Exact: the Gaussian mechanism with mu = 2C / (sigma C)."""

    clip: float = 1.0
    canaries_per_call: int = 256
    background_rows: int = 31
    canary_norm: float = 100.0

    @property
    def calls(self) -> int:
        return -(-self.trials // self.canaries_per_call)

    def gathered(self, release: Callable[[int], Any], scale: float = 1.0) -> np.ndarray:
        """The trials of `calls` updates: `release(call)` gives the canaries' coordinates of that call's
        released gradient, in clip units once multiplied by `scale` and divided by the clip."""
        out = np.empty((self.calls, self.canaries_per_call), dtype=np.float64)
        for call in range(self.calls):
            out[call] = release(call)
        return out.reshape(-1)[: self.trials] * scale / self.clip

    def update_result(
        self,
        mechanism: str,
        scores: Callable[[bool], np.ndarray],
        claimed: float,
        started: float,
        function: str,
        canaries: str,
        **extra: object,
    ) -> dict:
        """`result` judged against the Gaussian mechanism with mu = 2C / (sigma C)."""
        return self.result(
            mechanism,
            scores,
            gaussian_epsilon(2.0 / self.noise_multiplier, self.delta),
            claimed,
            started,
            function=function,
            canaries=canaries,
            calls_per_input=self.calls,
            background_rows=self.background_rows,
            canary_norm=self.canary_norm,
            **extra,
            exact_of="the Gaussian mechanism, mu = 2C / (sigma C)",
        )


def replace_one_claim(noise_multiplier: float, delta: float) -> float:
    """What the DP-SGD accountant reports for one query at sampling rate 1, as replace-one."""
    from dpsynth.models.privacy.dpsgd_accountant import Phase, replace_one_epsilon

    return replace_one_epsilon(Phase(1.0, noise_multiplier, 1), delta)


# ------------------------------------------------------------------- auditing with one training run


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Probability of v or more correct guesses out of r (m canaries, each included with probability 1/2)
    under (epsilon, delta)-DP: Steinke, Nasr and Jagielski 2023, "Privacy auditing with one (1) training
    run", Theorem 5.2 as computed in their Appendix D."""
    from scipy.stats import binom

    if not 0 <= v <= r <= m:
        raise ValueError("need 0 <= v <= r <= m")
    q = 1.0 / (1.0 + math.exp(-epsilon))  # the accuracy of epsilon-DP randomised response
    tail = float(binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    worst, below = 0.0, 0.0
    for i in range(1, v + 1):  # below = P[v > Binomial(r, q) >= v - i]
        below += float(binom.pmf(v - i, r, q))
        worst = max(worst, below / i)
    return min(1.0, tail + worst * delta * 2 * m)


def one_run_epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """The largest epsilon that v correct guesses of r refute at `confidence` (0 when none is)."""
    p = 1.0 - confidence
    if r == 0 or one_run_p_value(m, r, v, 0.0, delta) >= p:
        return 0.0
    low, high = 0.0, 1.0
    while one_run_p_value(m, r, v, high, delta) < p:
        high += 1.0
    for _ in range(40):
        middle = (low + high) / 2
        if one_run_p_value(m, r, v, middle, delta) < p:
            low = middle
        else:
            high = middle
    return low


def pooled_train_audit(runs: list[dict], delta: float) -> float:
    """One lower bound from several independent runs: their canaries and guesses together (the correct
    guesses of independent runs add up, each dominated by its binomial)."""
    m = sum(r["canaries"] for r in runs)
    return one_run_epsilon_lower_bound(m, sum(r["guesses"] for r in runs), sum(r["correct"] for r in runs), delta)
