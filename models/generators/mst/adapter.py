"""MST behind the generator interface (the plan, checkpoints and curve it shares with AIM:
models/generators/graphical/zcdp_adapter.py): its fit (models/generators/mst/fit.py) and what it publishes."""

from __future__ import annotations

from typing import Any

from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.cell_counts import one_and_two_way
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.base import (
    ADJACENCY,
    NO_DONORS,
    PrivacyFacts,
    SummaryEntry,
    TrainingJob,
    require_private,
)
from dpsynth.models.generators.graphical import zcdp_adapter
from dpsynth.models.generators.graphical.mechanisms import L2_SENSITIVITY, SCORE_SENSITIVITY
from dpsynth.models.generators.graphical.model import MSTModel
from dpsynth.models.generators.graphical.zcdp_adapter import ZCDPModelGenerator, generator_file
from dpsynth.models.generators.mst.config import MSTConfig

__all__ = ["LABELS", "MST", "generator_file", "training_rho"]

# What a reader calls each public parameter (the release notes' labels).
LABELS = {
    "mst_rho": "MST's zCDP rho (replace-one)",
    "mst_rho_shapes": "rho of the continuous columns' fine 1-way histograms (mst.shape_share of it)",
    "mst_rho_one_way": "rho of the 1-way marginals (mst.one_way_share of the rest)",
    "mst_rho_selection": "rho of the tree's selection rounds (mst.selection_share of the rest)",
    "mst_rho_two_way": "rho of the tree's 2-way marginals (the rest of the rest)",
    "mst_bins": "bins per continuous column (MST)",
    "mst_gaussian_sensitivity": "L2 sensitivity of each marginal (replace-one)",
    "mst_score_sensitivity": "sensitivity of each selection score (replace-one)",
    "mst_noise_penalty": "selection scores less the expected measurement error",
}


def training_rho(profile: Profile, setting: Setting) -> float:
    """MST's rho for `setting`: `mst.rho`, or the largest that fits the setting's budget."""
    return zcdp_adapter.training_rho(profile, setting, "mst")


class MST(ZCDPModelGenerator):
    name = "mst"
    label = "MST"
    # Null rho follows each setting's budget: a summary of several settings leaves these out.
    setting_parameters = ("mst_rho", "mst_rho_shapes", "mst_rho_one_way", "mst_rho_selection", "mst_rho_two_way")

    def check(self, profile: Profile, setting: Setting, schema: DatasetSchema | None = None) -> None:
        require_private(self, setting)
        training_rho(profile, setting)
        if schema is not None and len(schema.columns) < 2:
            raise ConfigError(f"MST builds a tree of column pairs: schema {schema.name!r} has one column.")

    def cliques(self, profile: Profile, schema: DatasetSchema) -> list[tuple[int, ...]]:
        return one_and_two_way(len(schema.columns))

    def fit_model(
        self, job: TrainingJob, rho: float
    ) -> tuple[MSTModel, dict[str, Any], dict[str, float], dict[str, float]]:
        from dpsynth.models.generators.mst.fit import fit_counts

        config: MSTConfig = job.profile.mst
        fitted = fit_counts(
            self.cell_counts(job), tuple(job.schema.columns), rho, job.secret.numpy, config.bins, config.iterations,
            config.noise_penalty, (config.one_way_share, config.selection_share),
        )  # fmt: skip
        return fitted.model, fitted.info, fitted.seconds, {"mst_estimator_final_loss": fitted.loss}

    def training_facts(self, profile: Profile, setting: Setting) -> PrivacyFacts:
        config: MSTConfig = profile.mst
        rho = training_rho(profile, setting)
        fitted = zcdp_adapter.model_rho(profile, setting, self.name)
        return PrivacyFacts(
            generator=self.label,
            mechanism=(
                "MST (McKenna, Miklau and Sheldon 2021): the Gaussian mechanism on every column's 1-way marginal "
                "over its public cells; d - 1 rounds of the exponential mechanism choosing a spanning tree of "
                "column pairs, each pair scored by the L1 distance between its counts and their estimate from "
                "the noisy 1-way marginals; the Gaussian mechanism on the chosen pairs' 2-way marginals; a "
                "graphical model estimated from the noisy marginals (private-pgm) is released; "
                "the Gaussian mechanism on every continuous column's fine 1-way histogram (one cell per value, "
                "or 16 sub-cells per cell), which places each sampled value inside its cell"
            ),
            accountant=(
                "zCDP: d 1-way marginals at noise std s1, d - 1 selection rounds at epsilon e (e^2 / 8 each) and "
                "d - 1 2-way marginals at noise std s2 add up to rho = d / s1^2 + (d - 1)(e^2 / 8 + 1 / s2^2), "
                "mst.one_way_share on the first phase, mst.selection_share on the second, the rest on the third, "
                "after the share mst.shape_share of rho spent on the fine histograms (c "
                "of them at noise std s3, c / s3^2); RDP order x rho"
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
                "mst_rho_shapes": rho - fitted,
                "mst_rho_one_way": fitted * config.one_way_share,
                "mst_rho_selection": fitted * config.selection_share,
                "mst_rho_two_way": fitted * (1.0 - config.one_way_share - config.selection_share),
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
