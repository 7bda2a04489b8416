"""The decision around a setting's training, one place for every flow and every generator: what a
setting will cost before any work (plan and budget), and which checkpoint it publishes (or shows).

* `planned_cost`: the generator's plan within the setting's budget, refused when the release would
  not be covered (the generator's own refusals, the thesis protocol), when a release under a budget
  trains a non-private setting, or when the whole release (training with the DP choice) would exceed
  the budget.
* `decide`: for a release, the DP choice of the checkpoint and the DP approval (models/privacy/release_choice.py)
  with the whole release's epsilon; for an experiment, the internal choice by AUC (models/evaluation/choice.py),
  unless the profile asks the experiment to decide as a release would (`evaluation.experiment_choice:
  dp`, for comparisons at matched whole-release epsilon).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import BudgetExceededError, ConfigError
from dpsynth.models.generators import generator_for
from dpsynth.models.generators.base import TrainingPlan
from dpsynth.models.marginals.release import mechanism_prose
from dpsynth.models.privacy.budget import check_release_budget, fits
from dpsynth.models.privacy.lifetime import ReleaseCost, release_cost
from dpsynth.models.privacy.release_choice import (
    ReleaseDecision,
    decide_release,
    decision_epsilon,
    whole_release_epsilon,
)
from dpsynth.models.privacy.secret import PrivacySecret
from dpsynth.models.privacy.statement import PrivacyStatement, privacy_statement


def refuse_uncovered(profile: Profile, setting: Setting) -> None:
    """A release publishes only what its epsilon covers (ConfigError otherwise)."""
    reason = generator_for(profile, setting).uncovered_in_release(profile, setting)
    if reason:
        raise ConfigError(reason)
    if profile.protocol != "honest":
        raise ConfigError(
            f"Profile {profile.name!r} uses protocol {profile.protocol!r}: its KNN imputation over all rows is not "
            "covered by epsilon, so a release refuses it. Use protocol: honest, or run it as an experiment."
        )


def planned_cost(
    profile: Profile, setting: Setting, release: bool, schema: DatasetSchema | None = None
) -> TrainingPlan:
    """The setting's training plan, after every check that can refuse it before any work."""
    generator = generator_for(profile, setting)
    generator.check(profile, setting, schema)
    if release:
        refuse_uncovered(profile, setting)
    plan = generator.plan(profile, setting)
    budget = profile.budget_for(setting)
    if release and not setting.private and not fits(math.inf, budget):
        raise BudgetExceededError(
            f"Setting {setting.name!r} is not private (epsilon = infinity), above the "
            f"budget {budget}; a release under a budget must train a private setting."
        )
    if release and setting.private:
        check_release_budget(plan.epsilon, decision_epsilon(profile), profile.protocol == "honest", budget)
    return plan


def release_cost_of(profile: Profile, setting: Setting, trained_iterations: int, epsilon: float) -> ReleaseCost:
    """What a release of `setting` trained to `trained_iterations` and published at whole-release `epsilon`
    enters in the table's lifetime ledger: its generator's replace-one training curve where it has one."""
    curve = (
        generator_for(profile, setting).training_curve(profile, setting, int(trained_iterations))
        if setting.private
        else None
    )
    return release_cost(profile, setting, epsilon, curve)


def planned_release_cost(profile: Profile, setting: Setting) -> ReleaseCost:
    """The most a release of `setting` can cost: training to the last checkpoint its budget allows, and the
    DP choice (what the lifetime budget checks before any work)."""
    plan = generator_for(profile, setting).plan(profile, setting)
    return release_cost_of(profile, setting, plan.last, whole_release_epsilon(profile, plan.epsilon))


def statement_for(profile: Profile, setting: Setting, *, release: bool) -> PrivacyStatement:
    """The one statement of what epsilon covers, from the facts of the generator that trains `setting`."""
    facts = generator_for(profile, setting).privacy_facts(profile, setting)
    return privacy_statement(profile, setting, facts, mechanism_prose(profile), release=release)


@dataclass(frozen=True)
class Choice:
    """A setting's chosen checkpoint: `epsilon` is what publishing it costs (the whole release's under
    the DP decision; training's at that checkpoint under the experiment's internal choice)."""

    iteration: int
    epsilon: float
    test_auc: float
    release: ReleaseDecision | None = None

    def as_dict(self) -> dict:
        return {"iteration": self.iteration, "epsilon": self.epsilon, "test_auc": self.test_auc}


def decide(
    results: pd.DataFrame,
    ledger: list[dict],
    profile: Profile,
    setting: Setting,
    *,
    release: bool,
    schema: DatasetSchema | None = None,
    encoded_path: Path | None = None,
    split_path: Path | None = None,
    secret: PrivacySecret | None = None,
) -> Choice | None:
    """The checkpoint `setting` publishes (release, or experiment_choice dp) or shows (experiment).

    `results`: the setting's selection runs, one row per checkpoint. The DP decision also needs the
    schema, the encoded rows and split (its validation facts) and the run's privacy secret."""
    from dpsynth.models.evaluation.choice import choose_checkpoint, selection_metric

    rows = results[results["setting"] == setting.name] if "setting" in results.columns else results
    if release or (profile.evaluation.experiment_choice == "dp" and setting.private):
        from dpsynth.tasks.evaluate import validation_facts

        if schema is None or encoded_path is None or split_path is None or secret is None:
            raise ValueError("the DP decision needs the schema, the encoded rows, the split and the privacy secret")
        decision = decide_release(
            rows,
            float(ledger[-1]["epsilon"]),
            validation_facts(schema, encoded_path, split_path),
            choice_epsilon_=profile.privacy.choice_epsilon,
            approval_epsilon=profile.privacy.approval_epsilon,
            min_release_auc=profile.evaluation.min_release_auc,
            share_gap_weight=profile.evaluation.share_gap_weight,
            disjoint=profile.protocol == "honest",
            secret=secret,
        )
        chosen = rows[rows["iteration"] == decision.iteration].iloc[0]
        return Choice(decision.iteration, decision.epsilon, float(chosen["test_auc"]), decision)
    pick = choose_checkpoint(
        rows,
        selection_metric(profile.protocol),
        profile.evaluation.auc_tolerance,
        profile.budget_for(setting),
        profile.evaluation.complete_levels,
        profile.evaluation.max_level_share_gap,
    )
    if pick is None:
        return None
    eps = float(pick["epsilon"])
    return Choice(int(pick["iteration"]), eps if not math.isnan(eps) else math.inf, float(pick["test_auc"]))
