"""Empirical privacy auditing: lower bounds on epsilon from a distinguishing experiment.

A mechanism that is (epsilon, delta)-DP bounds every test that tells two neighbouring inputs apart:
TPR <= e^epsilon FPR + delta and (1 - FPR) <= e^epsilon (1 - TPR) + delta. Running a test many times on
both inputs and bounding its true and false positive rates with Clopper-Pearson intervals turns an
observed advantage into a lower bound on epsilon that holds with the stated confidence (Jagielski,
Ullman and Oprea 2020; Nasr et al. 2021). If the bound exceeds what an accountant claims, the claim is
false (with that confidence).

The threshold of the test is chosen on a calibration half of the trials and the bound is computed on
the other half, so choosing it costs no confidence.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.stats import beta

from models.accountant import epsilon_for
from models.config import GanConfig, PrivacyConfig, Setting
from models.networks import CriticStack
from models.secret import PrivacySecret


def clopper_pearson(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Two one-sided bounds on a binomial rate, each holding with probability `confidence`."""
    alpha = 1.0 - confidence
    lower = 0.0 if successes == 0 else float(beta.ppf(alpha, successes, trials - successes + 1))
    upper = 1.0 if successes == trials else float(beta.ppf(1.0 - alpha, successes + 1, trials - successes))
    return lower, upper


def epsilon_from_rates(tp: int, positives: int, fp: int, negatives: int, delta: float,
                       confidence: float = 0.95) -> float:
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


def audit_scores(statistics: dict[str, tuple[np.ndarray, np.ndarray]], delta: float,
                 confidence: float = 0.95) -> AuditResult:
    """Lower bound from test scores: for each statistic, scores of trials on the first input (higher:
    more likely the first) and on the second. The statistic and its threshold are chosen on the first
    half of the trials; the bound is computed on the other half only."""
    best = None
    for name, (first, second) in statistics.items():
        a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
        bound, threshold = _calibrate(a[:len(a) // 2], b[:len(b) // 2], delta, confidence)
        if best is None or bound > best[0]:
            best = (bound, name, threshold, a[len(a) // 2:], b[len(b) // 2:])
    _, name, threshold, test_a, test_b = best
    tp, fp = int((test_a > threshold).sum()), int((test_b > threshold).sum())
    bound = epsilon_from_rates(tp, len(test_a), fp, len(test_b), delta, confidence)
    return AuditResult(bound, name, threshold, tp, fp, min(len(test_a), len(test_b)), confidence)


def mixture_log_likelihood_ratio(projections: np.ndarray, probability: float, shift: float, noise_std: float,
                                 shared: bool) -> np.ndarray:
    """Log-likelihood ratio of "some queries came from the shifted critic" for sanitised rows projected
    on the shift's direction, [trials, steps, rows]: under the second input every row is N(-shift/2,
    s^2); under the first, with probability q a query's rows are N(+shift/2, s^2) instead, each row on
    its own (`shared` False: a critic per row) or all rows of a step together (`shared` True)."""
    z = projections * (shift / noise_std ** 2)        # log N(+)/N(-) of each row
    log_keep, log_q = math.log1p(-probability), math.log(probability)
    if shared:
        per_step = np.logaddexp(log_keep, log_q + z.sum(axis=2))
        return per_step.sum(axis=1)
    return np.logaddexp(log_keep, log_q + z).sum(axis=(1, 2))


# ------------------------------------------------------------------------------- the step audit


@dataclass(frozen=True)
class StepAuditSetup:
    """The mechanism audited: K critics, B rows per step, noise multiplier, clip, delta."""

    discriminators: int = 100
    batch_size: int = 32
    noise_multiplier: float = 1.07
    clip: float = 1.0
    delta: float = 1e-5
    width: int = 4
    hidden: int = 16

    def claimed(self, critic_draw: str, steps: int) -> float:
        return epsilon_for(self.discriminators, steps, self.batch_size, self.noise_multiplier, self.delta,
                           critic_draw)


def planted_critics(setup: StepAuditSetup, first_input: bool, canary_critic: int = 0) -> CriticStack:
    """Linear critics on [-1, 1]^d (every hidden unit active): critic j's upstream gradient -grad D_j is
    -C e for every j, except the canary's critic on the first input: +C e, the worst case (the largest
    change of a clipped gradient, the same for every generated row)."""
    k, width, hidden = setup.discriminators, setup.width, setup.hidden
    upstream = torch.zeros(k, width)
    upstream[:, 0] = -setup.clip
    if first_input:
        upstream[canary_critic, 0] = setup.clip
    w1 = (-upstream).unsqueeze(-1).expand(k, width, hidden).contiguous()
    return CriticStack.from_params([w1, torch.full((k, 1, hidden), 10.0), torch.full((k, hidden, 1), 1.0 / hidden),
                                    torch.zeros(k, 1, 1)], batchnorm=False)


def sanitised_projections(setup: StepAuditSetup, critic_draw: str, first_input: bool, trials: int, steps: int,
                          secret: PrivacySecret, workdir: Path) -> np.ndarray:
    """[trials, steps, B]: the first coordinate of every sanitised row of trials x steps queries of the
    trainer (`GeneratorTrainer.draw_critics`, then `generator_step`: the functions `step` calls, without
    the critic refresh, which planted critics do not need)."""
    from models.gswgan import GeneratorTrainer, make_partition

    k, b = setup.discriminators, setup.batch_size
    gan = GanConfig(z_dim=4, generator_hidden=(16,), critic_hidden=setup.hidden, batch_size=b, lr_critic=0.0,
                    critic_refresh_steps=1, critic_draw=critic_draw, iterations=1, checkpoint_every=1)
    data = torch.rand(2 * k, setup.width, generator=torch.Generator().manual_seed(0)) * 2 - 1
    privacy = PrivacyConfig(noise_multiplier=setup.noise_multiplier, clip=setup.clip, delta=setup.delta)
    trainer = GeneratorTrainer(data, make_partition(2 * k, k, secret), planted_critics(setup, first_input), gan,
                               privacy, Setting("audit", k), [], 0, workdir, torch.device("cpu"), secret)
    out = np.empty((trials * steps, b), dtype=np.float64)
    # One intra-op thread, as training runs: the step is many tiny operations.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(trials * steps):
            out[i] = trainer.generator_step(trainer.draw_critics())[:, 0].double().numpy()
    finally:
        torch.set_num_threads(before)
    return out.reshape(trials, steps, b)


def step_audit(setup: StepAuditSetup, trials: int, steps: int, seed: int = 0) -> list[dict]:
    """Three audits of T = `steps` steps, `trials` trials per input each (see bench/audit.py): the
    per-row mechanism against its claim, the shared critic against the per-row claim (the old
    accounting), and the shared critic against its own claim."""
    noise_std = 2.0 * setup.noise_multiplier * setup.clip
    observed = {}
    with tempfile.TemporaryDirectory() as tmp:
        for draw in ("per_row", "per_step"):
            for first in (True, False):
                secret = PrivacySecret.from_hex(f"{seed:016x}{steps:016x}{int(first):016x}{len(draw):016x}")
                observed[draw, first] = sanitised_projections(setup, draw, first, trials, steps, secret,
                                                              Path(tmp) / f"{draw}-{int(first)}")

    def statistics(draw):
        return {name: tuple(mixture_log_likelihood_ratio(observed[draw, first], 1.0 / setup.discriminators,
                                                         2 * setup.clip, noise_std, shared) for first in (True, False))
                for name, shared in (("a critic per row", False), ("one critic per step", True))}

    audits = []
    for draw, claim_of, label in (("per_row", "per_row", "per_row"),
                                  ("per_step", "per_row", "per_step scored as T x B (the old accounting)"),
                                  ("per_step", "per_step", "per_step")):
        result = audit_scores(statistics(draw), setup.delta)
        claimed = setup.claimed(claim_of, steps)
        audits.append({
            "mechanism": label, "steps": steps, "epsilon_claimed": round(claimed, 4),
            "epsilon_lower_bound": round(result.epsilon_lower_bound, 4),
            "claim_refuted": bool(result.epsilon_lower_bound > claimed), "trials": trials,
            "statistic": result.statistic, "confidence": result.confidence,
            "true_positives": result.true_positives, "false_positives": result.false_positives,
            "discriminators": setup.discriminators, "batch_size": setup.batch_size,
            "sigma": setup.noise_multiplier, "delta": setup.delta})
    return audits
