"""MST behind the generator interface: checkpoint 0 is a model that read no row (each column uniform over
its writable cells), checkpoint 1 the fitted one (models/generators/mst/fit.py).

Its cost is zCDP: rho (`mst.rho`, or the largest that fits the setting's budget) under replace-one
adjacency, whose RDP at order a is a x rho; the measured marginals' rho is added to it before the one
conversion (models/marginals/measure.py `epsilon_of_rho`, classic), so every epsilon this generator
plans, records or publishes is the replace-one epsilon of rho + the marginals' rho (of the marginals'
alone at checkpoint 0)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dpsynth.models.checkpoint_files import save_verified
from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError
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
from dpsynth.models.generators.mst.config import MSTConfig
from dpsynth.models.generators.mst.model import FORMAT, MSTModel
from dpsynth.models.generators.mst.privacy import L2_SENSITIVITY, SCORE_SENSITIVITY, epsilon_of, rho_for_epsilon
from dpsynth.models.marginals.release import REPLACE_ONE, marginals_rho

if TYPE_CHECKING:
    from dpsynth.models.privacy.lifetime import TrainingCurve

# What a reader calls each public parameter (the release notes' labels).
LABELS = {
    "mst_rho": "MST's zCDP rho (replace-one)",
    "mst_rho_one_way": "rho of the 1-way marginals (a third)",
    "mst_rho_selection": "rho of the tree's selection rounds (a third)",
    "mst_rho_two_way": "rho of the tree's 2-way marginals (a third)",
    "mst_bins": "bins per continuous column (MST)",
    "mst_gaussian_sensitivity": "L2 sensitivity of each marginal (replace-one)",
    "mst_score_sensitivity": "sensitivity of each selection score (replace-one)",
    "mst_noise_penalty": "selection scores less the expected measurement error",
}


def training_rho(profile: Profile, setting: Setting) -> float:
    """MST's rho for `setting`: `mst.rho`, or, when null, the largest whose epsilon with the measured
    marginals' rho added fits the setting's budget (training's budget: the DP choice reads disjoint rows)."""
    config: MSTConfig = profile.mst
    if config.rho is not None:
        return config.rho
    budget = profile.budget_for(setting)
    if budget is None:
        raise ConfigError(
            f"Setting {setting.name!r}: mst.rho is null, which takes the largest rho that fits the setting's "
            "budget, and the setting has no budget: set mst.rho or an epsilon budget."
        )
    return rho_for_epsilon(budget, profile.privacy.delta, marginals_rho(profile, REPLACE_ONE))


def checkpoint_rho(profile: Profile, setting: Setting, iteration: int) -> float:
    """The zCDP spent on the training rows at a checkpoint: the measured marginals', and MST's from 1 on."""
    measured = marginals_rho(profile, REPLACE_ONE)
    return measured + training_rho(profile, setting) if iteration >= 1 else measured


class MST(GeneratorType):
    name = "mst"
    label = "MST"
    # Null rho follows each setting's budget: a summary of several settings leaves these out.
    setting_parameters = ("mst_rho", "mst_rho_one_way", "mst_rho_selection", "mst_rho_two_way")

    def check(self, profile: Profile, setting: Setting, schema: DatasetSchema | None = None) -> None:
        require_private(self, setting)
        training_rho(profile, setting)
        if schema is not None and len(schema.columns) < 2:
            raise ConfigError(f"MST builds a tree of column pairs: schema {schema.name!r} has one column.")

    def schedule(self, profile: Profile, setting: Setting) -> Schedule:
        delta = profile.privacy.delta
        return Schedule(
            (0, 1),
            tuple(epsilon_of(checkpoint_rho(profile, setting, t), delta) for t in (0, 1)),
            1,
            "lower mst.rho (null: the largest that fits the budget)",
        )

    def checkpoint_interval(self, profile: Profile) -> int:
        return 1

    def training_curve(self, profile: Profile, setting: Setting, trained_iterations: int) -> TrainingCurve:
        """Order x (MST's rho + the measured marginals'), replace-one. A TrainingCurve is GS-WGAN's inputs plus
        an added replace-one zCDP line (its `marginals_rho`): MST's curve is that line alone, with no
        critic query composed (iterations 0)."""
        from dpsynth.models.privacy.lifetime import TrainingCurve

        rho = checkpoint_rho(profile, setting, int(trained_iterations))
        return TrainingCurve(1, 0, 1, 1.0, "per_row", marginals_rho=rho)

    def fit(self, job: TrainingJob, prepared: Path, plan: TrainingPlan, progress: Progress | None = None) -> FitResult:
        """Checkpoint 0, then (when planned) the fit on the training rows, decoded to the schema. A fit is
        redone whole when training is resumed: the same secret draws the same noise."""
        from dpsynth.models.generators.mst.fit import fit as fit_mst

        started = time.perf_counter()
        config: MSTConfig = job.profile.mst
        columns = tuple(job.schema.columns)
        directory = job.directory / "checkpoints"
        directory.mkdir(parents=True, exist_ok=True)
        ledger, info, internal = [], {}, {}
        for iteration, epsilon in zip(plan.iterations, plan.epsilons, strict=True):
            if iteration == 0:
                model = MSTModel.uniform(columns, config.bins)
            else:
                rho = training_rho(job.profile, job.setting)
                table = TableEncoder(job.schema).decode(job.data)
                fitted = fit_mst(
                    table, columns, rho, job.secret.numpy, config.bins, config.iterations, config.noise_penalty
                )
                model = fitted.model
                info = {"mst": fitted.info, "mst_seconds": fitted.seconds}
                internal = {"mst_estimator_final_loss": fitted.loss}
            path = directory / f"mst_{iteration:06d}.pt"
            digest = save_verified(
                generator_file(model, job.schema, iteration, epsilon, job.profile.privacy.delta), path
            )
            ledger.append({"iteration": iteration, "epsilon": epsilon, "generator": path.name, "sha256": digest})
            if progress is not None:
                progress(iteration, f"epsilon {epsilon:.3f}")
        return FitResult(ledger, time.perf_counter() - started, info=info, internal_metrics=internal)

    def training_facts(self, profile: Profile, setting: Setting) -> PrivacyFacts:
        config: MSTConfig = profile.mst
        rho = training_rho(profile, setting)
        return PrivacyFacts(
            generator=self.label,
            mechanism=(
                "MST (McKenna, Miklau and Sheldon 2021): the Gaussian mechanism on every column's 1-way marginal "
                "over its public cells; d - 1 rounds of the exponential mechanism choosing a spanning tree of "
                "column pairs, each pair scored by the L1 distance between its counts and their estimate from "
                "the noisy 1-way marginals; the Gaussian mechanism on the chosen pairs' 2-way marginals; a "
                "graphical model estimated from the noisy marginals (private-pgm) is released"
            ),
            accountant=(
                "zCDP: d 1-way marginals at noise std s1, d - 1 selection rounds at epsilon e (e^2 / 8 each) and "
                "d - 1 2-way marginals at noise std s2 add up to rho = d / s1^2 + (d - 1)(e^2 / 8 + 1 / s2^2), a "
                "third on each phase; RDP order x rho"
            ),
            conversion="classic: epsilon = min over orders a of a x rho + log(1/delta)/(a - 1)",
            sampling="every training row counts once in every measured marginal and in every selection score",
            adjacency=(f"{ADJACENCY} (L2 sensitivity sqrt(2) per marginal, score sensitivity 2 per selection round)"),
            sanitised=(
                "every marginal's counts get Gaussian noise and every selection round Gumbel noise (the "
                "exponential mechanism), both from a secret drawn for the run; the cells a column keeps, the "
                "candidate pairs, the scores' estimates and the released model are computed from noisy outputs "
                "and public facts only"
            ),
            imputation=NO_DONORS,
            parameters={
                "mst_rho": rho,
                "mst_rho_one_way": rho / 3.0,
                "mst_rho_selection": rho / 3.0,
                "mst_rho_two_way": rho / 3.0,
                "mst_bins": config.bins,
                "mst_gaussian_sensitivity": L2_SENSITIVITY,
                "mst_score_sensitivity": SCORE_SENSITIVITY,
                "mst_noise_penalty": config.noise_penalty,
            },
            labels=LABELS,
        )

    def summary_entries(self, profile: Profile, schema: DatasetSchema | None = None) -> dict[str, SummaryEntry]:
        return {
            "mst_iterations": SummaryEntry(
                "estimator iterations (mirror descent, post-processing)", profile.mst.iterations
            )
        }


def generator_file(model: MSTModel, schema: DatasetSchema, iteration: int, epsilon: float, delta: float) -> dict:
    """A checkpoint's contents: the model's tables as tensors (torch.load's weights-only reader takes
    them), its layout, the schema's identity (for the encoder) and the checkpoint's public facts."""
    arrays, meta = model.to_arrays()
    return {
        "format": FORMAT,
        "schema": {"name": schema.name, "version": schema.version, "target": schema.target},
        "model": {"meta": meta, "arrays": {name: torch.from_numpy(values) for name, values in arrays.items()}},
        "iteration": iteration,
        "epsilon": epsilon,
        "delta": delta,
    }
