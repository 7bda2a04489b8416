"""Membership inference against a released synthetic table: how well the synthetic rows tell the
generator's training rows (members) from real rows it never saw (non-members). Internal report only:
these read real rows.

* Distance to closest record (DCR): for each synthetic row, is its nearest real row (among equally
  many members and non-members) a member? A generator that copies its training rows gives a share well
  above 1/2; the share is reported with a Clopper-Pearson interval.
* Two black-box attacks that score each real row from the synthetic table alone, reported as attack
  AUC (members against non-members) with a 95% interval (Hanley and McNeil's standard error):
  - nearest synthetic row: the closer a real row's nearest synthetic row, the more likely a member;
  - density ratio (in the style of DOMIAS, van Breugel et al. 2023): the synthetic rows' density at the
    row over a reference density estimated on other real rows (the validation split), with Gaussian
    kernels; memorised rows are where the synthetic density is high for their place.
An AUC near 0.5 means the attack learns nothing; a DP generator bounds it (an (epsilon, delta)-DP
release keeps any attack's TPR at most e^epsilon FPR + delta).

Rows are compared in the encoded space ([-1, 1] per encoded column, models/data/encoding.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta, norm
from sklearn.metrics import roc_auc_score
from sklearn.neighbors import KernelDensity, NearestNeighbors


@dataclass(frozen=True)
class AttackAUC:
    auc: float
    low: float
    high: float


def auc_interval(scores_members: np.ndarray, scores_non_members: np.ndarray, confidence: float = 0.95) -> AttackAUC:
    """AUC of telling members from non-members by score (higher: member), with Hanley-McNeil's
    normal interval."""
    y = np.r_[np.ones(len(scores_members)), np.zeros(len(scores_non_members))]
    auc = float(roc_auc_score(y, np.r_[scores_members, scores_non_members]))
    m, n = len(scores_members), len(scores_non_members)
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    se = math.sqrt(max(auc * (1 - auc) + (m - 1) * (q1 - auc * auc) + (n - 1) * (q2 - auc * auc), 0.0) / (m * n))
    z = float(norm.ppf(0.5 + confidence / 2))
    return AttackAUC(auc, max(0.0, auc - z * se), min(1.0, auc + z * se))


def dcr_member_share(
    synthetic: np.ndarray, members: np.ndarray, non_members: np.ndarray, confidence: float = 0.95
) -> dict:
    """Share of synthetic rows whose nearest real row is a member (equal numbers of both: 1/2 when
    the generator does not favour its training rows), with its Clopper-Pearson interval, and the median
    distances to the closest member and to the closest non-member."""
    if len(members) != len(non_members):
        raise ValueError("DCR compares equally many members and non-members")
    nn_members = NearestNeighbors(n_neighbors=1).fit(members)
    nn_others = NearestNeighbors(n_neighbors=1).fit(non_members)
    d_members = nn_members.kneighbors(synthetic)[0][:, 0]
    d_others = nn_others.kneighbors(synthetic)[0][:, 0]
    closer = int((d_members < d_others).sum() + 0.5 * (d_members == d_others).sum())
    alpha = (1 - confidence) / 2
    n = len(synthetic)
    low = 0.0 if closer == 0 else float(beta.ppf(alpha, closer, n - closer + 1))
    high = 1.0 if closer == n else float(beta.ppf(1 - alpha, closer + 1, n - closer))
    return {
        "share_closer_to_members": closer / n,
        "low": low,
        "high": high,
        "median_distance_to_members": float(np.median(d_members)),
        "median_distance_to_non_members": float(np.median(d_others)),
    }


def nearest_synthetic_attack(synthetic: np.ndarray, members: np.ndarray, non_members: np.ndarray) -> AttackAUC:
    nn = NearestNeighbors(n_neighbors=1).fit(synthetic)

    def score(rows: np.ndarray) -> np.ndarray:
        return -nn.kneighbors(rows)[0][:, 0]  # the closer its nearest synthetic row, the likelier a member

    return auc_interval(score(members), score(non_members))


def _bandwidth(rows: np.ndarray) -> float:
    """Scott's rule on the rows' average spread."""
    n, d = rows.shape
    return float(np.mean(rows.std(axis=0)) * n ** (-1.0 / (d + 4)) + 1e-6)


def density_ratio_attack(
    synthetic: np.ndarray, reference: np.ndarray, members: np.ndarray, non_members: np.ndarray
) -> AttackAUC:
    syn = KernelDensity(bandwidth=_bandwidth(synthetic)).fit(synthetic)
    ref = KernelDensity(bandwidth=_bandwidth(reference)).fit(reference)

    def score(rows: np.ndarray) -> np.ndarray:
        return syn.score_samples(rows) - ref.score_samples(rows)

    return auc_interval(score(members), score(non_members))


def membership_report(
    synthetic: np.ndarray,
    members: np.ndarray,
    non_members: np.ndarray,
    reference: np.ndarray,
    rows: int = 2000,
    seed: int = 0,
) -> dict:
    """All three, on at most `rows` members, as many non-members, 2 x `rows` synthetic and reference rows
    (drawn with `seed`)."""
    rng = np.random.default_rng(seed)

    def take(a: np.ndarray, n: int) -> np.ndarray:
        return a[rng.choice(len(a), n, replace=False)] if len(a) > n else a

    m = min(rows, len(members), len(non_members))
    members, non_members = take(members, m), take(non_members, m)
    synthetic, reference = take(synthetic, 2 * rows), take(reference, 2 * rows)
    nearest = nearest_synthetic_attack(synthetic, members, non_members)
    ratio = density_ratio_attack(synthetic, reference, members, non_members)
    return {
        "rows_each": m,
        "dcr": dcr_member_share(synthetic, members, non_members),
        "nearest_synthetic_auc": nearest.__dict__,
        "density_ratio_auc": ratio.__dict__,
    }
