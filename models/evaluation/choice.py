"""The experiment's choice of a checkpoint per setting: the thesis' "best model" rule (Figure 7.1).

This reads AUCs on real rows and is not differentially private: it serves the experiment's internal
study only. A release chooses its checkpoint with models/privacy/release_choice.py, a DP mechanism.

Per setting, the lowest-epsilon checkpoint whose AUC is within `tolerance` of the setting's best AUC,
optionally only among checkpoints within an epsilon budget. Among equal epsilons (the non-private
baseline, epsilon = inf everywhere) the higher AUC wins, then the earlier iteration.

With `complete_levels`, only checkpoints whose synthetic rows hold every level of every binary and
categorical column (all "share:" columns above 0) compete, when there is any: a generator that lost a
level is a worse release whatever its AUC. That rule reads synthetic data and the public schema only.
With `max_share_gap`, only checkpoints whose level shares are all within it of the real validation rows'
(column "real_val_share_gap") compete, when there is any; like the AUC on real validation rows this
reads real rows, and the experiment's report says the choice is not covered by epsilon.
"""

from __future__ import annotations

import math

import pandas as pd

from dpsynth.models.privacy.budget import fits


def selection_metric(protocol: str) -> str:
    """The AUC a checkpoint is chosen by: on real validation rows under the honest protocol (the test
    split is never used to choose), on the test split under the thesis protocol (as the thesis did)."""
    return "real_val_auc" if protocol == "honest" else "test_auc"


def choose_checkpoint(
    results: pd.DataFrame,
    metric: str,
    tolerance: float,
    epsilon_budget: float | None = None,
    complete_levels: bool = False,
    max_share_gap: float | None = None,
) -> pd.Series | None:
    """`results` has one row per checkpoint with columns iteration, epsilon, `metric` and (for
    `complete_levels`) the level shares "share:<column>=<level>", (for `max_share_gap`)
    "real_val_share_gap"."""
    rows = results.dropna(subset=[metric])
    if epsilon_budget is not None:
        rows = rows[rows["epsilon"].map(lambda e: fits(float(e), epsilon_budget))]
    if rows.empty:
        return None
    shares = [c for c in rows.columns if c.startswith("share:")]
    if complete_levels and shares:
        complete = rows[(rows[shares] > 0).all(axis=1)]
        if not complete.empty:
            rows = complete
    if max_share_gap is not None and "real_val_share_gap" in rows.columns:
        close_shares = rows[rows["real_val_share_gap"] <= max_share_gap]
        if not close_shares.empty:
            rows = close_shares
    best = rows[metric].max()
    close = rows[rows[metric] >= best - tolerance]
    order = close.assign(_eps=close["epsilon"].map(lambda e: math.inf if pd.isna(e) else e))
    order = order.sort_values(["_eps", metric, "iteration"], ascending=[True, False, True])
    return order.drop(columns="_eps").iloc[0]
