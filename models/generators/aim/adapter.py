"""AIM behind the generator interface: checkpoint 0 is a model that read no row (each column uniform over
its writable cells), checkpoint 1 the fitted one (models/generators/aim/fit.py).

Its cost is zCDP: rho (`aim.rho`, or the largest that fits the setting's budget) under replace-one
adjacency, whose RDP at order a is a x rho; the measured marginals' rho is added to it before the one
conversion (MST's `epsilon_of`, classic), so every epsilon this generator plans, records or publishes is
the replace-one epsilon of rho + the marginals' rho (of the marginals' alone at checkpoint 0)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from dpsynth.models.checkpoint_files import save_verified
from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.aim.config import AIMConfig
from dpsynth.models.generators.aim.privacy import L1_SENSITIVITY, L2_SENSITIVITY, SELECTION_SHARE, AIMBudget
from dpsynth.models.generators.base import (
    ADJACENCY,
    NO_DONORS,
    FitResult,
    GeneratorType,
    PrivacyFacts,
    Progress,
    Schedule,
    SummaryEntry,
    TrainingJob,
    TrainingPlan,
    require_private,
)
from dpsynth.models.generators.mst.adapter import generator_file
from dpsynth.models.generators.mst.model import MSTModel
from dpsynth.models.generators.mst.privacy import epsilon_of, rho_for_epsilon
from dpsynth.models.marginals.release import REPLACE_ONE, marginals_rho

if TYPE_CHECKING:
    from dpsynth.models.privacy.lifetime import TrainingCurve

# What a reader calls each public parameter (the release notes' labels).
LABELS = {
    "aim_rho": "AIM's zCDP rho (replace-one)",
    "aim_rounds": "rounds the budget is first split into (T)",
    "aim_selection_share": "share of each round's rho spent on its selection",
    "aim_bins": "bins per continuous column (AIM)",
    "aim_workload": "marginals AIM's selection scores",
    "aim_max_model_mb": "largest model a round may grow to (MB)",
    "aim_gaussian_sensitivity": "L2 sensitivity of each marginal (replace-one)",
    "aim_score_sensitivity": "sensitivity of each selection score per unit of weight (replace-one)",
}


def training_rho(profile: Profile, setting: Setting) -> float:
    """AIM's rho for `setting`: `aim.rho`, or, when null, the largest whose epsilon with the measured
    marginals' rho added fits the setting's budget (training's budget: the DP choice reads disjoint rows)."""
    config: AIMConfig = profile.aim
    if config.rho is not None:
        return config.rho
    budget = profile.budget_for(setting)
    if budget is None:
        raise ConfigError(
            f"Setting {setting.name!r}: aim.rho is null, which takes the largest rho that fits the setting's "
            "budget, and the setting has no budget: set aim.rho or an epsilon budget."
        )
    return rho_for_epsilon(budget, profile.privacy.delta, marginals_rho(profile, REPLACE_ONE))


def checkpoint_rho(profile: Profile, setting: Setting, iteration: int) -> float:
    """The zCDP spent on the training rows at a checkpoint: the measured marginals', and AIM's from 1 on."""
    measured = marginals_rho(profile, REPLACE_ONE)
    return measured + training_rho(profile, setting) if iteration >= 1 else measured


def rounds(config: AIMConfig, columns: int) -> int:
    """The paper's T: `aim.rounds`, or 16 per column."""
    return config.rounds if config.rounds is not None else 16 * columns


class AIM(GeneratorType):
    name = "aim"
    label = "AIM"
    # Null rho follows each setting's budget: a summary of several settings leaves it out.
    setting_parameters = ("aim_rho",)

    def check(self, profile: Profile, setting: Setting, schema: DatasetSchema | None = None) -> None:
        require_private(self, setting)
        rho = training_rho(profile, setting)
        if schema is not None:
            AIMBudget(rho, len(schema.columns), rounds(profile.aim, len(schema.columns)))

    def schedule(self, profile: Profile, setting: Setting) -> Schedule:
        delta = profile.privacy.delta
        return Schedule(
            (0, 1),
            tuple(epsilon_of(checkpoint_rho(profile, setting, t), delta) for t in (0, 1)),
            1,
            "lower aim.rho (null: the largest that fits the budget)",
        )

    def checkpoint_interval(self, profile: Profile) -> int:
        return 1

    def training_curve(self, profile: Profile, setting: Setting, trained_iterations: int) -> TrainingCurve:
        """Order x (AIM's rho + the measured marginals'), replace-one: a TrainingCurve holding that zCDP line
        alone (its `marginals_rho`), with no critic query composed (iterations 0), as MST's."""
        from dpsynth.models.privacy.lifetime import TrainingCurve

        rho = checkpoint_rho(profile, setting, int(trained_iterations))
        return TrainingCurve(1, 0, 1, 1.0, "per_row", marginals_rho=rho)

    def fit(self, job: TrainingJob, prepared: Path, plan: TrainingPlan, progress: Progress | None = None) -> FitResult:
        """Checkpoint 0, then (when planned) the fit on the training rows, decoded to the schema. A fit is
        redone whole when training is resumed: the same secret draws the same noise."""
        from dpsynth.models.generators.aim.fit import fit as fit_aim

        started = time.perf_counter()
        config: AIMConfig = job.profile.aim
        columns = tuple(job.schema.columns)
        directory = job.directory / "checkpoints"
        directory.mkdir(parents=True, exist_ok=True)
        ledger, info, internal = [], {}, {}
        for iteration, epsilon in zip(plan.iterations, plan.epsilons, strict=True):
            if iteration == 0:
                model = MSTModel.uniform(columns, config.bins)
            else:
                fitted = fit_aim(
                    TableEncoder(job.schema).decode(job.data),
                    columns,
                    job.schema.target,
                    training_rho(job.profile, job.setting),
                    job.secret.numpy,
                    bins=config.bins,
                    rounds=rounds(config, len(columns)),
                    max_model_mb=config.max_model_mb,
                    round_iterations=config.round_iterations,
                    iterations=config.iterations,
                    workload=config.workload,
                )
                model = fitted.model
                info = {"aim": fitted.info, "aim_seconds": fitted.seconds}
                internal = {"aim_estimator_final_loss": fitted.loss}
            path = directory / f"aim_{iteration:06d}.pt"
            digest = save_verified(
                generator_file(model, job.schema, iteration, epsilon, job.profile.privacy.delta), path
            )
            ledger.append({"iteration": iteration, "epsilon": epsilon, "generator": path.name, "sha256": digest})
            if progress is not None:
                progress(iteration, f"epsilon {epsilon:.3f}")
        return FitResult(ledger, time.perf_counter() - started, info=info, internal_metrics=internal)

    def training_facts(self, profile: Profile, setting: Setting) -> PrivacyFacts:
        config: AIMConfig = profile.aim
        return PrivacyFacts(
            generator=self.label,
            mechanism=(
                "AIM (McKenna, Mullins, Sheldon and Miklau 2022): the Gaussian mechanism on every column's "
                "1-way marginal over its public cells; then rounds, each choosing by the exponential mechanism "
                "the workload marginal (or a subset of one) whose estimate from the noisy marginals so far is "
                "worst, scored by its weight x (L1 distance between its counts and that estimate less the "
                "public expected error of its own measurement), among those that keep the model within a "
                "public size cap, and measuring it by the Gaussian mechanism; rounds halve the noise and "
                "double the selection's epsilon when a measurement changed the estimate less than its noise, "
                "and the last round spends what is left; a graphical model estimated from the noisy "
                "marginals (private-pgm) is released"
            ),
            accountant=(
                "zCDP: each Gaussian measurement at noise std s costs 1 / s^2, each selection at epsilon e "
                "costs e^2 / 8 (bounded range); the first rounds run at s and e that would spend rho in T "
                f"rounds ({1 - SELECTION_SHARE:g} on measurements, {SELECTION_SHARE:g} on selections), the 1-way "
                "marginals at the same s; the rounds' costs add up to rho exactly; RDP order x rho"
            ),
            conversion="classic: epsilon = min over orders a of a x rho + log(1/delta)/(a - 1)",
            sampling="every training row counts once in every measured marginal and in every selection score",
            adjacency=(
                f"{ADJACENCY} (L2 sensitivity sqrt(2) per marginal; score sensitivity 2 x the largest weight "
                "among a round's candidates)"
            ),
            sanitised=(
                "every marginal's counts get Gaussian noise and every selection Gumbel noise (the exponential "
                "mechanism), both from a secret drawn for the run; the candidates, the size cap, the scores' "
                "estimates, the noise schedule and the released model are computed from noisy outputs and "
                "public facts only"
            ),
            imputation=NO_DONORS,
            parameters={
                "aim_rho": training_rho(profile, setting),
                "aim_rounds": config.rounds if config.rounds is not None else "16 per column",
                "aim_selection_share": SELECTION_SHARE,
                "aim_bins": config.bins,
                "aim_workload": config.workload,
                "aim_max_model_mb": config.max_model_mb,
                "aim_gaussian_sensitivity": L2_SENSITIVITY,
                "aim_score_sensitivity": L1_SENSITIVITY,
            },
            labels=LABELS,
        )

    def summary_entries(self, profile: Profile, schema: DatasetSchema | None = None) -> dict[str, SummaryEntry]:
        config: AIMConfig = profile.aim
        return {
            "aim_iterations": SummaryEntry(
                "estimator iterations per round and final (mirror descent, post-processing)",
                f"{config.round_iterations}, {config.iterations}",
            )
        }
