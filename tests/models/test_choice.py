"""The released checkpoint's choice (dpsynth.models.evaluation.choice)."""

from __future__ import annotations

import math

import pandas as pd

from dpsynth.models.evaluation.choice import choose_checkpoint, selection_metric


def _results(rows):
    return pd.DataFrame(rows, columns=["iteration", "epsilon", "real_val_auc", "share:smoke=0", "share:smoke=1"])


def test_lowest_epsilon_within_tolerance_of_the_best():
    results = _results(
        [
            (0, 0.0, 0.55, 0.9, 0.1),
            (1000, 2.0, 0.705, 0.9, 0.1),
            (2000, 3.0, 0.71, 0.9, 0.1),
            (3000, 4.0, 0.70, 0.9, 0.1),
        ]
    )
    assert choose_checkpoint(results, "real_val_auc", 0.01)["iteration"] == 1000
    assert choose_checkpoint(results, "real_val_auc", 0.0)["iteration"] == 2000


def test_budget_excludes_later_checkpoints_and_none_when_nothing_fits():
    results = _results([(1000, 2.0, 0.60, 0.9, 0.1), (2000, 3.0, 0.71, 0.9, 0.1)])
    assert choose_checkpoint(results, "real_val_auc", 0.01, epsilon_budget=2.5)["iteration"] == 1000
    assert choose_checkpoint(results, "real_val_auc", 0.01, epsilon_budget=1.0) is None


def test_non_private_ties_on_epsilon_go_to_the_higher_auc_then_the_earlier_iteration():
    results = _results(
        [(1000, math.inf, 0.70, 0.9, 0.1), (2000, math.inf, 0.705, 0.9, 0.1), (3000, math.inf, 0.705, 0.9, 0.1)]
    )
    assert choose_checkpoint(results, "real_val_auc", 0.01)["iteration"] == 2000


def test_complete_levels_skips_checkpoints_that_lost_a_level_unless_all_did():
    results = _results([(1000, 2.0, 0.72, 1.0, 0.0), (2000, 3.0, 0.69, 0.9, 0.1)])
    assert choose_checkpoint(results, "real_val_auc", 0.01)["iteration"] == 1000
    assert choose_checkpoint(results, "real_val_auc", 0.01, complete_levels=True)["iteration"] == 2000
    collapsed = _results([(1000, 2.0, 0.72, 1.0, 0.0), (2000, 3.0, 0.69, 1.0, 0.0)])
    assert choose_checkpoint(collapsed, "real_val_auc", 0.01, complete_levels=True)["iteration"] == 1000


def test_max_share_gap_prefers_checkpoints_close_to_the_real_level_shares():
    results = _results([(1000, 2.0, 0.72, 0.9, 0.1), (2000, 3.0, 0.71, 0.9, 0.1), (3000, 4.0, 0.69, 0.9, 0.1)])
    results["real_val_share_gap"] = [0.30, 0.10, 0.05]
    assert choose_checkpoint(results, "real_val_auc", 0.01)["iteration"] == 1000
    assert choose_checkpoint(results, "real_val_auc", 0.01, max_share_gap=0.15)["iteration"] == 2000
    assert choose_checkpoint(results, "real_val_auc", 0.01, max_share_gap=0.01)["iteration"] == 1000  # none close


def test_selection_metric_never_uses_the_test_split_under_the_honest_protocol():
    assert selection_metric("honest") == "real_val_auc"
    assert selection_metric("thesis") == "test_auc"
