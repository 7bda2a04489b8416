"""AIM's profile section `aim`: its zCDP budget, the cells of a continuous column, the rounds, the model
size cap, the estimator's iterations and the workload. Delta, the budget, the DP choice and the measured
marginals are the shared privacy keys."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, Strict

from dpsynth.models.config_validation import Count, Positive
from dpsynth.models.generator_section import SectionConfig

# The workload AIM answers: every pair of columns, or those and every triple that holds the target.
Workload = Literal["pairs", "pairs-and-target-triples"]


class AIMConfig(SectionConfig):
    # The generator checks' smoke run (SectionConfig.smoke): null rho under smoke's budget (1000) would run
    # hundreds of rounds, so a fixed rho and the fewest rounds Cardio's 12 columns allow (the 1-way
    # marginals, then two or three rounds), few estimator iterations.
    smoke = {"rho": 0.5, "rounds": 13, "round_iterations": 20, "iterations": 50}
    # AIM's whole zCDP (replace-one). null: the largest rho whose replace-one epsilon, with the profile's
    # measured marginals composed (their rho added), fits the setting's budget (a setting without a
    # budget then needs a rho). The DP choice of the checkpoint reads the validation rows, disjoint from
    # the training rows under the honest protocol, so it costs in parallel.
    rho: Positive | None = None
    # Equal-width bins of a continuous column's public bounds (plus one cell per declared point mass).
    bins: Annotated[int, Strict(), Field(ge=1, le=1000)] = 20
    # The rounds the budget is first split into (the paper's T); null: 16 per column. Annealing spends
    # faster when the model stops improving, so fewer rounds run.
    rounds: Count | None = None
    # The largest junction tree (megabytes of float64 cells) a round may choose to grow the model to; the
    # cap grows with the share of rho spent (the paper's default is 80: this caps the estimator's cost).
    max_model_mb: Positive = 2.0
    # Warm-started mirror-descent iterations after each round's measurement, and of the final estimate
    # (post-processing of the noisy marginals).
    round_iterations: Count = 100
    iterations: Count = 1000
    # Which marginals the selection scores: the target is public (the schema names it).
    workload: Workload = "pairs-and-target-triples"
