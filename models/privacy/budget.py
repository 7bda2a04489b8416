"""The one place where an epsilon meets a budget.

Generators report their whole, uncapped schedule (every checkpoint and the replace-one epsilon of
training to it, measured marginals included); this module cuts it at the setting's budget, checks a
release's whole cost before any work, and is the comparison the experiment's checkpoint choice and
the registry's last guard use. A budget of None means no budget; an epsilon that is not a number
never fits one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpsynth.models.errors import BudgetExceededError
from dpsynth.models.privacy.release_choice import release_epsilon


@dataclass(frozen=True)
class Schedule:
    """A generator's checkpoints (0 first) and training's epsilon at each, before any budget.

    `first_trained` is the first checkpoint with a trained generator (a plan must reach it); `hint` says
    which of the generator's keys lower the cost, for the error when even that checkpoint is over budget."""

    iterations: tuple[int, ...]
    epsilons: tuple[float, ...]
    first_trained: int
    hint: str


@dataclass(frozen=True)
class TrainingPlan:
    """Checkpoint iterations to train (0 first) and training's epsilon at each, within the budget."""

    iterations: tuple[int, ...]
    epsilons: tuple[float, ...]
    stopped_by_budget: bool = False

    @property
    def last(self) -> int:
        return self.iterations[-1]

    @property
    def epsilon(self) -> float:
        return self.epsilons[-1]


def fits(epsilon: float, budget: float | None) -> bool:
    """Whether spending `epsilon` stays within `budget` (None: no budget). NaN never fits."""
    if math.isnan(epsilon):
        return False
    return budget is None or epsilon <= budget


def cut_to_budget(schedule: Schedule, budget: float | None, setting_name: str) -> TrainingPlan:
    """The schedule up to its last checkpoint within `budget`; an error when not even the first trained
    checkpoint fits."""
    iterations, epsilons = schedule.iterations, schedule.epsilons
    if budget is None:
        return TrainingPlan(iterations, epsilons)
    kept = 0
    for i, epsilon in enumerate(epsilons):
        if fits(epsilon, budget):
            kept = i + 1
    if kept == 0 or iterations[kept - 1] < schedule.first_trained:
        first = next(i for i, t in enumerate(iterations) if t >= schedule.first_trained)
        raise BudgetExceededError(
            f"Setting {setting_name!r}: even the first trained checkpoint (iteration {iterations[first]}) costs "
            f"epsilon {epsilons[first]:.2f}, above the budget {budget:g}. Raise the budget, or {schedule.hint}."
        )
    return TrainingPlan(iterations[:kept], epsilons[:kept], kept < len(iterations))


def check_release_budget(
    epsilon_training_last: float, epsilon_choice: float, disjoint: bool, budget: float | None
) -> float:
    """The planned release epsilon (training with the DP choice); raises `BudgetExceededError` when it
    is above the budget."""
    total, _ = release_epsilon(epsilon_training_last, epsilon_choice, disjoint)
    if not fits(total, budget):
        raise BudgetExceededError(
            f"The release would cost epsilon {total:.4g} (training {epsilon_training_last:.4g}, DP choice "
            f"{epsilon_choice:.4g}), above the budget {budget:g}. Lower privacy.choice_epsilon or "
            "privacy.approval_epsilon, or raise the budget."
        )
    return total


def check_registration(epsilon: float | None, budget: float | None) -> None:
    """Raise `BudgetExceededError` unless a published release of `epsilon` is allowed under `budget`: the
    registry's last guard, after the release's own checks."""
    if epsilon is None or math.isnan(epsilon):
        raise BudgetExceededError("The release's epsilon is unknown (not a number): nothing is registered.")
    if not fits(epsilon, budget):
        what = "a non-private generator (epsilon = infinity)" if math.isinf(epsilon) else f"epsilon {epsilon:.4g}"
        raise BudgetExceededError(
            f"Refusing to register {what}: it exceeds the privacy budget of {budget:g}. Nothing was "
            "registered and the current champion is unchanged. Release an earlier checkpoint, or raise "
            "'privacy.epsilon_budget' in the profile if that budget was set too low."
        )
