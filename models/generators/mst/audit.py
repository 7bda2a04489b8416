"""MST's calibration audits (`bench/audit.py --mode calibration`; the statistics are models/privacy/audit.py's):
its Gaussian measurement and its exponential-mechanism selection, each called on a canary pair that moves
its input by the whole replace-one sensitivity, without subsampling.

Each is judged against the exact epsilon of what the budget says the step spends, computed apart from the
code under audit: a measurement that MST's budget charges rho is the Gaussian mechanism with
mu = sqrt(2 rho) (models/privacy/exact_loss.py); a selection at epsilon e over scores of sensitivity D
draws candidate i with probability softmax(e u / (2 D))_i, and the exact epsilon is that pair of discrete
distributions' (`discrete_epsilon`). The claim is the project's conversion of the step's rho (e^2 / 8 for
a selection). `halve_noise` (a check of the audit) halves the measurement's std, or the selection's
sensitivity (which halves its Gumbel noise against the scores: the add/remove-one sensitivity a
replace-one analysis must not use), and the audit must then refute.

AIM runs the same two functions at its own scales (models/generators/aim/audit.py), through the helpers
both import (models/generators/graphical/audit.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from dpsynth.models.generators.graphical.audit import counts_audit, selection_audit
from dpsynth.models.generators.graphical.mechanisms import SCORE_SENSITIVITY
from dpsynth.models.generators.mst.fit import joint_counts
from dpsynth.models.generators.mst.privacy import MSTBudget


def measurement_audit(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    rho: float = 2.62,
    levels: int = 3,
    rows: int = 50,
    delta: float = 1e-5,
    required: float | None = None,
    seed: int = 0,
) -> dict:
    """A 2-way marginal as MST measures it (`joint_counts` of two columns' codes, `gaussian_counts` at the
    budget's `two_way_std`), on a table of three `levels`-level columns: `rows` - 1 public rows and a
    canary in cell (0, 0) on the first input, (levels - 1, levels - 1) on the neighbour. The budget
    (rho 2.62 on three columns) charges each 2-way marginal rho / 6 = 0.437: mu = 0.93, as the other
    calibration audits."""
    budget = MSTBudget(rho, 3)
    public = np.random.default_rng(seed)
    a, b = public.integers(levels, size=rows - 1), public.integers(levels, size=rows - 1)
    counts = {
        first: joint_counts(
            np.append(a, 0 if first else levels - 1), np.append(b, 0 if first else levels - 1), levels, levels
        )
        for first in (True, False)
    }
    return counts_audit(
        "mst-measurement",
        counts[True],
        counts[False],
        budget.two_way_std,
        budget.phase_rho[2] / budget.rounds,
        trials,
        halve_noise,
        delta,
        required,
        seed,
        budget=budget.to_dict(),
        rows=rows,
    )


def tree_selection_audit(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    rho: float = 54.0,
    columns: int = 10,
    delta: float = 1e-5,
    required: float | None = None,
    seed: int = 0,
) -> dict:
    """The first round of MST's tree selection (`select_tree` calls `exponential_mechanism` at the budget's
    `selection_epsilon` over every pair that joins two components: in the first round, every pair). The
    canary pair (0, 1) scores the sensitivity 2 on the first input and 0 on the neighbour, every other pair
    0 and 2: each score moves by at most 2. The budget (rho 54 on ten columns) selects at epsilon 4."""
    budget = MSTBudget(rho, columns)
    pairs = list(itertools.combinations(range(columns), 2))
    canary = np.array([p == (0, 1) for p in pairs])
    first = np.where(canary, SCORE_SENSITIVITY, 0.0)
    second = np.where(canary, 0.0, SCORE_SENSITIVITY)
    return selection_audit(
        "mst-selection",
        first,
        second,
        budget.selection_epsilon,
        SCORE_SENSITIVITY,
        trials,
        halve_noise,
        delta,
        required,
        seed,
        budget=budget.to_dict(),
    )


# Each called as audit(trials=..., halve_noise=..., seed=...); listed in the audit table through MST's
# registration (models/generators/audit_table.py).
CALIBRATION_AUDITS: dict[str, Callable[..., dict]] = {
    "mst-measurement": measurement_audit,
    "mst-selection": tree_selection_audit,
}
