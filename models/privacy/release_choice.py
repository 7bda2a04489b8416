"""The release decision: which checkpoint to publish, whether to publish at all, and what it costs.

Training stops at a checkpoint fixed before any data is seen (the last within the budget), and every
checkpoint up to it exists before the choice, so the release costs at least training's epsilon at the
LAST checkpoint, whichever one is published. The choice among them and the publish/refuse decision read
real validation rows, so they are differentially private mechanisms of their own:

* the choice: the exponential mechanism (as report-noisy-max with Gumbel noise) over checkpoints with
  score  s = 4 P / n^2 - w G / n,  where n is the number of validation rows (fixed by the secret split,
  not by any row's values), P the checkpoint classifier's concordant (positive, negative) pairs among
  the validation rows that needed no imputation (ties count 1/2; 4 P / n^2 is the AUC for a balanced
  target), G the largest gap, in rows, between a level's count in those rows and its synthetic share
  times their number, and w `evaluation.share_gap_weight`. Replacing one row changes P by at most n - 1
  (its own pairs) and G by at most 1, so the sensitivity is (4 + w) / n from public facts only;
  P(c) is proportional to exp(epsilon_choice s_c / (2 sensitivity)).
* the approval (`evaluation.min_release_auc` = a): publish if  P / n - a n_pos n_neg / n  plus Laplace
  noise of scale (1 + a) / epsilon_approval is at least 0. P / n moves by at most 1 and a n_pos n_neg / n
  by at most a when one row is replaced.

Both are pure epsilon-DP on the validation rows, and compose sequentially with each other. The
classifiers they score are trained on synthetic rows only (post-processing). With the row-local split
the validation rows are disjoint from the training rows and neither mechanism depends on the other's
rows, so under replace-one adjacency a changed row is either a training row (the choice is then
post-processing of training, which is (epsilon_train, delta)-DP) or a validation row (training is
unchanged, the choice is epsilon_choice-DP): the release is (max(epsilon_train, epsilon_choice),
delta)-DP. Where the generator trained on the validation rows too (`protocol: thesis`), the two
compose sequentially: epsilon_train + epsilon_choice. The noise comes from the run's privacy secret,
so a rerun of the same run decides the same way (a fresh draw would be a second, unaccounted choice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dpsynth.models.privacy.secret import PrivacySecret

if TYPE_CHECKING:
    from dpsynth.models.config import Profile

SCORE_COLUMNS = ("real_val_pairs", "real_val_gap_rows")


@dataclass(frozen=True)
class ValidationFacts:
    """What the decision may know about the validation rows: their number (public: fixed by the secret
    split) and, for the approval only, the class counts among the complete ones (private, used inside
    the noisy test)."""

    rows: int
    positives: int
    negatives: int


@dataclass(frozen=True)
class ReleaseDecision:
    iteration: int
    approved: bool
    epsilon_training: float
    epsilon_choice: float
    epsilon: float
    composition: str
    candidates: int


def choice_epsilon(choice_epsilon_: float, approval_epsilon: float, min_release_auc: float | None) -> float:
    """Epsilon the decision spends on the validation rows: the choice, plus the approval if any."""
    return float(choice_epsilon_) + (float(approval_epsilon) if min_release_auc is not None else 0.0)


def release_epsilon(epsilon_training: float, epsilon_choice: float, disjoint: bool) -> tuple[float, str]:
    """The whole release's epsilon and how it composes (see the module notes)."""
    if math.isinf(epsilon_training):
        return math.inf, "non-private training"
    if disjoint:
        return max(float(epsilon_training), float(epsilon_choice)), "parallel (disjoint training and validation rows)"
    return float(epsilon_training) + float(epsilon_choice), "sequential (the generator trained on validation rows)"


def decision_epsilon(profile: Profile) -> float:
    """What a `dpsynth.models.config.Profile`'s DP choice (and approval, if any) spends on the validation rows."""
    p = profile.privacy
    return choice_epsilon(p.choice_epsilon, p.approval_epsilon, profile.evaluation.min_release_auc)


def whole_release_epsilon(profile: Profile, training_epsilon: float) -> float:
    """The whole release's epsilon under `profile` when training costs `training_epsilon`."""
    return release_epsilon(training_epsilon, decision_epsilon(profile), profile.protocol == "honest")[0]


def choice_sensitivity(rows: int, share_gap_weight: float) -> float:
    return (4.0 + float(share_gap_weight)) / rows


def choice_scores(results: pd.DataFrame, facts: ValidationFacts, share_gap_weight: float) -> np.ndarray:
    n = float(facts.rows)
    pairs = results["real_val_pairs"].to_numpy(dtype=np.float64)
    gaps = results["real_val_gap_rows"].to_numpy(dtype=np.float64)
    return 4.0 * pairs / (n * n) - share_gap_weight * gaps / n


def candidates(results: pd.DataFrame) -> pd.DataFrame:
    """Checkpoints the choice may publish: every trained one (iteration > 0); among them, when any keeps
    every level of every discrete column in its synthetic rows, only those (synthetic data and the public
    schema only: free)."""
    rows = results[results["iteration"] > 0]
    if rows.empty:
        rows = results
    shares = [c for c in rows.columns if c.startswith("share:")]
    if shares:
        complete = rows[(rows[shares] > 0).all(axis=1)]
        if not complete.empty:
            rows = complete
    return rows


def exponential_mechanism(scores: np.ndarray, epsilon: float, sensitivity: float, rng: np.random.Generator) -> int:
    """Index drawn with probability proportional to exp(epsilon score / (2 sensitivity)) (Gumbel-max)."""
    logits = np.asarray(scores, dtype=np.float64) * (epsilon / (2.0 * sensitivity))
    return int(np.argmax(logits + rng.gumbel(size=len(logits))))


def noisy_approval(
    pairs: float, facts: ValidationFacts, floor: float, epsilon: float, rng: np.random.Generator
) -> bool:
    n = float(facts.rows)
    statistic = pairs / n - floor * facts.positives * facts.negatives / n
    return bool(statistic + rng.laplace(scale=(1.0 + floor) / epsilon) >= 0.0)


def decide_release(
    results: pd.DataFrame,
    epsilon_training_last: float,
    facts: ValidationFacts,
    *,
    choice_epsilon_: float,
    approval_epsilon: float,
    min_release_auc: float | None,
    share_gap_weight: float,
    disjoint: bool,
    secret: PrivacySecret,
) -> ReleaseDecision:
    """The DP choice of the checkpoint and the DP approval, with the whole release's epsilon.

    `results`: one row per checkpoint with iteration, the SCORE_COLUMNS and optional "share:" columns."""
    pool = candidates(results).sort_values("iteration").reset_index(drop=True)
    scores = choice_scores(pool, facts, share_gap_weight)
    pick = exponential_mechanism(
        scores, choice_epsilon_, choice_sensitivity(facts.rows, share_gap_weight), secret.numpy("release-choice")
    )
    chosen = pool.iloc[pick]
    approved = True
    if min_release_auc is not None:
        approved = noisy_approval(
            float(chosen["real_val_pairs"]),
            facts,
            float(min_release_auc),
            approval_epsilon,
            secret.numpy("release-approval"),
        )
    spent = choice_epsilon(choice_epsilon_, approval_epsilon, min_release_auc)
    total, composition = release_epsilon(epsilon_training_last, spent, disjoint)
    return ReleaseDecision(
        int(chosen["iteration"]), approved, float(epsilon_training_last), spent, total, composition, len(pool)
    )
