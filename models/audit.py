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


# ------------------------------------------------------------------- auditing with one training run


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Probability of v or more correct guesses out of r (m canaries, each included with probability 1/2)
    under (epsilon, delta)-DP: Steinke, Nasr and Jagielski 2023, "Privacy auditing with one (1) training
    run", Theorem 5.2 as computed in their Appendix D."""
    from scipy.stats import binom

    if not 0 <= v <= r <= m:
        raise ValueError("need 0 <= v <= r <= m")
    q = 1.0 / (1.0 + math.exp(-epsilon))          # the accuracy of epsilon-DP randomised response
    tail = float(binom.sf(v - 1, r, q))            # P[Binomial(r, q) >= v]
    worst, below = 0.0, 0.0
    for i in range(1, v + 1):                      # below = P[v > Binomial(r, q) >= v - i]
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


@dataclass(frozen=True)
class TrainAuditSetup:
    """A small end-to-end audit: a generated table of `base_rows`, `canaries` extreme rows each included
    with probability 1/2, K critics, the shipped generator, `iterations` private steps (or the same with
    the sanitiser off)."""

    base_rows: int = 100
    canaries: int = 200
    discriminators: int = 1
    iterations: int = 10000
    pretrain_iterations: int = 100
    noise_multiplier: float = 1.07
    delta: float = 1e-5
    synthetic_rows: int = 100000
    guesses: int = 40            # guesses made on each side (the k+ highest and k- lowest scores)


def canary_rows(schema, n: int, rng: np.random.Generator):
    """Distinct extreme, schema-valid rows: every continuous column at one of its public bounds, every
    discrete column at a level drawn uniformly (the base table's levels are skewed towards the first)."""
    import pandas as pd

    seen, rows = set(), []
    while len(rows) < n:
        row = {}
        for col in schema.columns:
            if col.kind == "continuous":
                row[col.name] = col.bounds[int(rng.integers(2))]
            else:
                row[col.name] = col.levels[int(rng.integers(len(col.levels)))]
        key = tuple(row.values())
        if key not in seen:
            seen.add(key)
            rows.append(row)
    return pd.DataFrame(rows)[schema.column_names]


def train_audit(schema, setup: TrainAuditSetup, private: bool, seed: int = 0) -> dict:
    """One training run with canaries (Steinke, Nasr and Jagielski 2023): train the shipped generator on
    the table with the included canaries, score every canary by how close the synthetic rows come to it,
    guess the k highest as included and the k lowest as excluded, and turn the correct guesses into an
    epsilon lower bound at 95%. `private` False switches the sanitiser off (no clipping, no noise)."""
    import dataclasses as dc

    import pandas as pd
    from sklearn.neighbors import NearestNeighbors

    from models.demo import make_demo_table
    from models.encoding import TableEncoder
    from models.gswgan import (
        GeneratorTrainer,
        make_partition,
        pretrain_critics,
        sample_encoded,
        target_condition,
    )

    rng = np.random.default_rng(seed)
    encoder = TableEncoder(schema)
    base = make_demo_table(schema, setup.base_rows, seed)[schema.column_names]
    canaries = canary_rows(schema, setup.canaries, rng)
    included = rng.random(setup.canaries) < 0.5
    table = pd.concat([base, canaries[included]], ignore_index=True)
    data = torch.from_numpy(encoder.encode(table).astype(np.float32))
    gan = dc.replace(GanConfig(), condition_on_target=True, output_head="gumbel", critic_refresh_steps=5,
                     generator_ema=0.999, pretrain_iterations=setup.pretrain_iterations,
                     iterations=setup.iterations, checkpoint_every=setup.iterations)
    condition = target_condition(gan, encoder.target_index, "binary")
    secret = PrivacySecret.from_hex(f"{seed:032x}{int(private):032x}")
    partition = make_partition(len(table), setup.discriminators, secret)
    cpu = torch.device("cpu")
    critics = pretrain_critics(data, partition, gan, encoder.head_groups(), seed, cpu, condition=condition)
    privacy = PrivacyConfig(noise_multiplier=setup.noise_multiplier, delta=setup.delta)
    setting = Setting("audit", setup.discriminators, private=private)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = GeneratorTrainer(data, partition, critics, gan, privacy, setting, encoder.head_groups(), seed,
                                   Path(tmp), cpu, secret, condition=condition)
        trainer.run(setup.iterations)
        synthetic = sample_encoded(trainer.released_generator(), setup.synthetic_rows, seed=seed)
        claimed = trainer.accountant.get_epsilon(setup.delta) if private else math.inf
    # Score: the distance from each canary to the nearest synthetic row with the same target (the
    # synthetic table carries its labels); closest first: guessed included.
    encoded_canaries = encoder.encode(canaries)
    t = encoder.target_index
    distance = np.empty(len(canaries))
    for label in (-1.0, 1.0):
        mine = encoded_canaries[:, t] == label
        pool = synthetic[np.sign(synthetic[:, t]) == label]
        if mine.any():
            distance[mine] = NearestNeighbors(n_neighbors=1).fit(pool).kneighbors(encoded_canaries[mine])[0][:, 0]
    order = np.argsort(distance)
    k = setup.guesses
    correct = int(included[order[:k]].sum() + (~included[order[-k:]]).sum())
    return {"sanitiser": "on" if private else "off", "epsilon_claimed": claimed,
            "epsilon_lower_bound": one_run_epsilon_lower_bound(setup.canaries, 2 * k, correct, setup.delta),
            "confidence": 0.95, "canaries": setup.canaries, "included": int(included.sum()), "guesses": 2 * k,
            "correct": correct, "discriminators": setup.discriminators, "iterations": setup.iterations,
            "base_rows": setup.base_rows}


def pooled_train_audit(runs: list[dict], delta: float) -> float:
    """One lower bound from several independent runs: their canaries and guesses together (the correct
    guesses of independent runs add up, each dominated by its binomial)."""
    m = sum(r["canaries"] for r in runs)
    return one_run_epsilon_lower_bound(m, sum(r["guesses"] for r in runs), sum(r["correct"] for r in runs), delta)
