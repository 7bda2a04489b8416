"""AIM's calibration audits (`bench/audit.py --mode calibration`): a round's Gaussian measurement and its
exponential-mechanism selection at AIM's own scales (`AIMBudget`'s first rounds) and sensitivity
(`score_sensitivity`: 2 x the largest weight), through the helpers and the judgement MST's audits use
(models/generators/graphical/audit.py), which the same two functions serve."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dpsynth.models.generators.aim.mechanism import candidate_weights, counts, workload
from dpsynth.models.generators.aim.privacy import L1_SENSITIVITY, SELECTION_SHARE, AIMBudget, score_sensitivity
from dpsynth.models.generators.graphical.audit import counts_audit, selection_audit


def measurement_audit(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    rho: float = 2.4263,
    rounds: int = 5,
    levels: int = 3,
    rows: int = 50,
    delta: float = 1e-5,
    required: float | None = None,
    seed: int = 0,
) -> dict:
    """A round's measurement (`counts` of the chosen clique, `gaussian_counts` at the budget's
    `initial_std`) of the pair (0, 1) on a table of three `levels`-level columns: `rows` - 1 public rows
    and a canary in cell (0, 0, 0) on the first input, in the last cell of every column on the
    neighbour. The budget (rho 2.43, three columns, five rounds) charges each measurement of the first
    rounds (1 - 0.1) rho / T = 0.437: mu = 0.93, as the other calibration audits."""
    budget = AIMBudget(rho, 3, rounds)
    public = np.random.default_rng(seed)
    background = [public.integers(levels, size=rows - 1) for _ in range(3)]
    answers = {
        first: counts([np.append(c, 0 if first else levels - 1) for c in background], [levels] * 3, (0, 1))
        for first in (True, False)
    }
    return counts_audit(
        "aim-measurement",
        answers[True],
        answers[False],
        budget.initial_std,
        (1.0 - SELECTION_SHARE) * budget.rho / budget.rounds,
        trials,
        halve_noise,
        delta,
        required,
        seed,
        budget=budget.to_dict(),
        rows=rows,
    )


def round_selection_audit(
    trials: int = 1_000_000,
    halve_noise: bool = False,
    rho: float = 160.0,
    columns: int = 6,
    rounds: int = 8,
    delta: float = 1e-5,
    required: float | None = None,
    seed: int = 0,
) -> dict:
    """A round's selection (`exponential_mechanism` at the budget's `initial_epsilon` with
    `score_sensitivity` of the candidates' weights) over the candidates of the workload of every pair
    of `columns` columns (`candidate_weights`: the pairs, weight 2 (d - 1), and the single columns, d - 1).
    A candidate's score moves by at most 2 x its weight: the canary pair (0, 1) gains that on the first
    input, every other candidate gains its own on the neighbour. The budget (rho 160, six columns, eight
    rounds) selects at epsilon 4."""
    budget = AIMBudget(rho, columns, rounds)
    weights = candidate_weights(workload(columns, columns - 1, "pairs"))
    cliques = list(weights)
    reach = np.array([L1_SENSITIVITY * weights[c] for c in cliques])
    canary = np.array([c == (0, 1) for c in cliques])
    return selection_audit(
        "aim-selection",
        np.where(canary, reach, 0.0),
        np.where(canary, 0.0, reach),
        budget.initial_epsilon,
        score_sensitivity(weights.values()),
        trials,
        halve_noise,
        delta,
        required,
        seed,
        budget=budget.to_dict(),
    )


# Each called as audit(trials=..., halve_noise=..., seed=...); listed in the audit table through AIM's
# registration (models/generators/audit_table.py).
CALIBRATION_AUDITS: dict[str, Callable[..., dict]] = {
    "aim-measurement": measurement_audit,
    "aim-selection": round_selection_audit,
}
