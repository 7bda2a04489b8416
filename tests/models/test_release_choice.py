"""The release decision (models/privacy/release_choice.py): the DP choice, the DP approval, the whole release's
epsilon and its composition."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dpsynth.models.errors import BudgetExceededError
from dpsynth.models.privacy.budget import check_release_budget
from dpsynth.models.privacy.release_choice import (
    ValidationFacts,
    choice_epsilon,
    choice_scores,
    decide_release,
    exponential_mechanism,
    noisy_approval,
    release_epsilon,
)
from dpsynth.models.privacy.secret import PrivacySecret
from tests.conftest import TEST_SECRET_HEX

SECRET = PrivacySecret.from_hex(TEST_SECRET_HEX)
FACTS = ValidationFacts(rows=1000, positives=480, negatives=500)


def _results(aucs, gaps=None, iterations=None) -> pd.DataFrame:
    iterations = iterations or [1000 * (i + 1) for i in range(len(aucs))]
    gaps = gaps or [0.0] * len(aucs)
    return pd.DataFrame(
        {
            "iteration": iterations,
            "real_val_pairs": [a * FACTS.positives * FACTS.negatives for a in aucs],
            "real_val_gap_rows": [g * 980 for g in gaps],
        }
    )


def test_release_costs_the_last_checkpoint_and_the_choice_composed_as_stated():
    assert release_epsilon(9.99, 1.0, disjoint=True) == (9.99, "parallel (disjoint training and validation rows)")
    assert release_epsilon(0.5, 1.1, disjoint=True)[0] == 1.1
    assert release_epsilon(9.99, 1.0, disjoint=False)[0] == pytest.approx(10.99)
    assert math.isinf(release_epsilon(math.inf, 1.0, disjoint=True)[0])
    assert choice_epsilon(1.0, 0.1, None) == 1.0 and choice_epsilon(1.0, 0.1, 0.7) == pytest.approx(1.1)
    assert check_release_budget(9.5, 1.0, True, 10.0) == 9.5
    with pytest.raises(BudgetExceededError, match="choice"):
        check_release_budget(0.5, 2.0, True, 1.0)
    with pytest.raises(BudgetExceededError):
        check_release_budget(9.5, 1.0, False, 10.0)


def test_decision_publishes_the_whole_release_epsilon_not_the_chosen_checkpoints():
    results = _results([0.60, 0.70, 0.78, 0.77])
    decision = decide_release(
        results,
        7.5,
        FACTS,
        choice_epsilon_=1.0,
        approval_epsilon=0.1,
        min_release_auc=None,
        share_gap_weight=1.0,
        disjoint=True,
        secret=SECRET,
    )
    assert decision.epsilon == 7.5 and decision.epsilon_training == 7.5 and decision.epsilon_choice == 1.0
    assert decision.iteration in results["iteration"].tolist() and decision.approved
    # The same secret decides the same way (a rerun draws no new noise); the untrained iteration 0 is not
    # a candidate when trained ones exist.
    again = decide_release(
        pd.concat([_results([0.9], iterations=[0]), results]),
        7.5,
        FACTS,
        choice_epsilon_=1.0,
        approval_epsilon=0.1,
        min_release_auc=None,
        share_gap_weight=1.0,
        disjoint=True,
        secret=SECRET,
    )
    assert again.iteration == decision.iteration and again.candidates == 4


def test_exponential_mechanism_draws_in_proportion_to_exp_of_the_score():
    scores = np.array([0.70, 0.71, 0.74])
    epsilon, sensitivity = 1.0, 5 / 1000
    weights = np.exp(epsilon * scores / (2 * sensitivity))
    expected = weights / weights.sum()
    rng = np.random.default_rng(0)
    draws = (
        np.bincount([exponential_mechanism(scores, epsilon, sensitivity, rng) for _ in range(20_000)], minlength=3)
        / 20_000
    )
    assert np.abs(draws - expected).max() < 0.015


def test_choice_prefers_high_auc_and_small_share_gaps():
    results = _results([0.78, 0.78, 0.70], gaps=[0.30, 0.01, 0.01])
    scores = choice_scores(results, FACTS, 1.0)
    assert scores.argmax() == 1 and scores[0] < scores[1] and scores[2] < scores[1]
    picks = [
        decide_release(
            results,
            5.0,
            FACTS,
            choice_epsilon_=2.0,
            approval_epsilon=0.1,
            min_release_auc=None,
            share_gap_weight=1.0,
            disjoint=True,
            secret=PrivacySecret.from_hex(f"{i:064x}"),
        ).iteration
        for i in range(50)
    ]
    assert picks.count(2000) > 45


def test_choice_keeps_checkpoints_with_every_level_when_any_has_them():
    results = _results([0.80, 0.70]).assign(**{"share:gluc=3": [0.0, 0.05]})
    decision = decide_release(
        results,
        5.0,
        FACTS,
        choice_epsilon_=0.001,
        approval_epsilon=0.1,
        min_release_auc=None,
        share_gap_weight=1.0,
        disjoint=True,
        secret=SECRET,
    )
    assert decision.iteration == 2000 and decision.candidates == 1


def test_noisy_approval_tracks_the_floor_and_spends_its_own_epsilon():
    rng = np.random.default_rng(1)
    good, bad = 0.80 * 480 * 500, 0.60 * 480 * 500
    assert all(noisy_approval(good, FACTS, 0.7, 1.0, rng) for _ in range(200))
    assert not any(noisy_approval(bad, FACTS, 0.7, 1.0, rng) for _ in range(200))
    # At the floor the test is a fair coin: the noise, not the rows, decides.
    at_floor = np.mean([noisy_approval(0.7 * 480 * 500, FACTS, 0.7, 1.0, rng) for _ in range(4000)])
    assert 0.45 < at_floor < 0.55
    refused = decide_release(
        _results([0.55, 0.56]),
        5.0,
        FACTS,
        choice_epsilon_=1.0,
        approval_epsilon=1.0,
        min_release_auc=0.75,
        share_gap_weight=1.0,
        disjoint=True,
        secret=SECRET,
    )
    assert not refused.approved and refused.epsilon_choice == 2.0 and refused.epsilon == 5.0
