"""AIM behind the generator interface (the plan, checkpoints and curve it shares with MST:
models/generators/graphical/zcdp_adapter.py): its fit (models/generators/aim/fit.py) and what it publishes."""

from __future__ import annotations

from typing import Any

from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators.aim.config import AIMConfig, OneWayRule
from dpsynth.models.generators.aim.privacy import L1_SENSITIVITY, L2_SENSITIVITY, SELECTION_SHARE
from dpsynth.models.generators.base import (
    ADJACENCY,
    NO_DONORS,
    PrivacyFacts,
    SummaryEntry,
    TrainingJob,
    require_private,
)
from dpsynth.models.generators.graphical import zcdp_adapter
from dpsynth.models.generators.graphical.model import MSTModel
from dpsynth.models.generators.graphical.zcdp_adapter import ZCDPModelGenerator

# What a reader calls each public parameter (the release notes' labels).
LABELS = {
    "aim_rho": "AIM's zCDP rho (replace-one)",
    "aim_rounds": "rounds the budget is first split into (T)",
    "aim_selection_share": "share of each round's rho spent on its selection",
    "aim_one_way_share": (
        "share of rho spent on the 1-way marginals together (0: at the first rounds' std; derived: from the "
        "schema's cells and the number of training rows)"
    ),
    "aim_bins": "bins per continuous column (AIM)",
    "aim_shape_share": "share of rho spent on the continuous columns' fine 1-way histograms",
    "aim_workload": "marginals AIM's selection scores",
    "aim_numeric_pair_weight": "workload weight of each pair of two continuous columns (others 1)",
    "aim_numeric_pair_groups": "groups of cells per column a pair of continuous columns is also scored on",
    "aim_numeric_pair_share": "share of rho spent on pair rounds among the pairs of continuous columns",
    "aim_pair_round_groups": "groups of cells per column a pair round measures a pair over",
    "aim_max_model_mb": "largest model a round may grow to (MB)",
    "aim_gaussian_sensitivity": "L2 sensitivity of each marginal (replace-one)",
    "aim_score_sensitivity": "sensitivity of each selection score per unit of weight (replace-one)",
}


def training_rho(profile: Profile, setting: Setting) -> float:
    """AIM's rho for `setting`: `aim.rho`, or the largest that fits the setting's budget."""
    return zcdp_adapter.training_rho(profile, setting, "aim")


def rounds(config: AIMConfig, columns: int) -> int:
    """The paper's T: `aim.rounds`, or 16 per column."""
    return config.rounds if config.rounds is not None else 16 * columns


def one_way_share_text(value: float | str | OneWayRule) -> float | str:
    """A declared share as it is; a derived one as its rule (the share itself is a run's, in its manifest)."""
    if isinstance(value, float):
        return value
    rule = value if isinstance(value, OneWayRule) else OneWayRule()
    return (
        f"derived: the least share whose noise std is at most {rule.noise_fraction:g} of a cell's expected "
        f"count in the column with the most cells, 0 if the first rounds' std is, at most {rule.cap:g}"
    )


class AIM(ZCDPModelGenerator):
    name = "aim"
    label = "AIM"
    # Null rho follows each setting's budget: a summary of several settings leaves it out.
    setting_parameters = ("aim_rho",)

    def check(self, profile: Profile, setting: Setting, schema: DatasetSchema | None = None) -> None:
        require_private(self, setting)
        rho = training_rho(profile, setting)
        if schema is not None:
            from dpsynth.models.generators.aim.fit import check_budget

            config: AIMConfig = profile.aim
            check_budget(tuple(schema.columns), rho, rounds(config, len(schema.columns)), config.one_way_share,
                         config.numeric_pair_share)  # fmt: skip

    def cliques(self, profile: Profile, schema: DatasetSchema) -> list[tuple[int, ...]]:
        from dpsynth.models.generators.aim.fit import counted_cliques

        config: AIMConfig = profile.aim
        return counted_cliques(tuple(schema.columns), schema.target, config.workload, config.numeric_pair_weight)

    def fit_model(
        self, job: TrainingJob, rho: float
    ) -> tuple[MSTModel, dict[str, Any], dict[str, float], dict[str, float]]:
        from dpsynth.models.generators.aim.fit import fit_counts

        config: AIMConfig = job.profile.aim
        columns = tuple(job.schema.columns)
        fitted = fit_counts(
            self.cell_counts(job),
            columns,
            job.schema.target,
            rho,
            job.secret.numpy,
            bins=config.bins,
            rounds=rounds(config, len(columns)),
            max_model_mb=config.max_model_mb,
            round_iterations=config.round_iterations,
            iterations=config.iterations,
            workload=config.workload,
            numeric_pair_weight=config.numeric_pair_weight,
            numeric_pair_groups=config.numeric_pair_groups,
            one_way_share=config.one_way_share,
            numeric_pair_share=config.numeric_pair_share,
            pair_round_groups=config.pair_round_groups,
        )
        return fitted.model, fitted.info, fitted.seconds, {"aim_estimator_final_loss": fitted.loss}

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
                "marginals (private-pgm) is released; "
                "at aim.numeric_pair_share > 0, before the rounds, pair rounds choose by the exponential "
                "mechanism among the pairs of continuous columns (over groups of cells cut from the noisy "
                "1-way estimate) the one worst estimated and measure it by the Gaussian mechanism; "
                "the Gaussian mechanism on every continuous column's fine 1-way histogram (one cell per value, "
                "or 16 sub-cells per cell), which places each sampled value inside its cell"
            ),
            accountant=(
                "zCDP: each Gaussian measurement at noise std s costs 1 / s^2, each selection at epsilon e "
                "costs e^2 / 8 (bounded range); the first rounds run at s and e that would spend rho in T "
                f"rounds ({1 - SELECTION_SHARE:g} on measurements, {SELECTION_SHARE:g} on selections), the 1-way "
                "marginals at the same s, or, at aim.one_way_share u > 0, d of them at s1 with d / s1^2 = u rho "
                "and the T rounds planned on the rest (a derived u is fixed from the schema's cells and the "
                "number of training rows, public under replace-one, before any count is read); "
                "at aim.numeric_pair_share u2 > 0, c - 1 pair rounds "
                "(c continuous columns) each at s2 and e2 with 1 / s2^2 + e2^2 / 8 = u2 rho / (c - 1), the rounds "
                "planned on what the shares leave; the rounds' costs add up to rho less the share "
                "aim.shape_share spent on the fine histograms (c of them at noise std s3, c / s3^2); RDP order x rho"
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
                "aim_one_way_share": one_way_share_text(config.one_way_share),
                "aim_bins": config.bins,
                "aim_shape_share": config.shape_share,
                "aim_workload": config.workload,
                "aim_numeric_pair_weight": config.numeric_pair_weight,
                "aim_numeric_pair_groups": config.numeric_pair_groups,
                "aim_numeric_pair_share": config.numeric_pair_share,
                "aim_pair_round_groups": config.pair_round_groups,
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
