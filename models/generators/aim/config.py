"""AIM's profile section `aim`: its zCDP budget, the cells of a continuous column, the rounds, the model
size cap, the estimator's iterations and the workload. Delta, the budget, the DP choice and the measured
marginals are the shared privacy keys."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, Strict

from dpsynth.models.config_validation import STRICT, Beta, Count, Positive
from dpsynth.models.generator_section import SectionConfig

# The workload AIM answers: every pair of columns, or those and every triple that holds the target.
Workload = Literal["pairs", "pairs-and-target-triples"]
# Chosen on generated tables only (docs/utility-study.md section 7); 1 is the paper's unweighted workload.
DEFAULT_NUMERIC_PAIR_WEIGHT = 1.0
# Off by default: 5 groups measured the numeric pairs (Spearman gap 0.055-0.060 -> 0.040 on the generated
# census table) but every such trial released a lower AUC (0.811 against 0.841-0.850), and a profile's
# AUC must not fall; a steward who needs the numeric pairs sets it (5 measured them best).
DEFAULT_NUMERIC_PAIR_GROUPS = 0
# Off by default (the paper's AIM); `aim-eps1` sets it (docs/utility-study.md section 12).
DEFAULT_NUMERIC_PAIR_SHARE = 0.0
DEFAULT_PAIR_ROUND_GROUPS = 5
# `one_way_share: auto`'s rule (docs/utility-study.md section 16): any fraction in about [0.04, 0.13] gave the
# shares the generated tables chose (0 on 70,000-row Cardio-like tables, 0.33 on 20,000-row census-shape
# ones); 0.07 is that range's middle on a log scale. The cap is section 11's share (0.45 was no better).
DEFAULT_ONE_WAY_NOISE_FRACTION = 0.07
DEFAULT_ONE_WAY_SHARE_CAP = 0.33


class OneWayRule(BaseModel):
    """A 1-way share derived from public facts (models/generators/aim/privacy.py `derived_one_way_share`):
    the least share whose noise std is at most `noise_fraction` of the expected count of a cell of the column
    with the most cells (the training rows spread evenly), 0 when the paper's std already is, at most `cap`."""

    model_config = STRICT
    noise_fraction: Annotated[float, Strict(), Field(gt=0, le=1)] = DEFAULT_ONE_WAY_NOISE_FRACTION
    cap: Annotated[float, Strict(), Field(gt=0, lt=1)] = DEFAULT_ONE_WAY_SHARE_CAP


class AIMConfig(SectionConfig):
    # The generator checks' smoke run (SectionConfig.checks_smoke): null rho under smoke's budget (1000) would run
    # hundreds of rounds, so a fixed rho and the fewest rounds Cardio's 12 columns allow (the 1-way
    # marginals, then two or three rounds), few estimator iterations.
    checks_smoke = {"rho": 0.5, "rounds": 13, "round_iterations": 20, "iterations": 50}
    # AIM's whole zCDP (replace-one). null: the largest rho whose replace-one epsilon, with the profile's
    # measured marginals composed (their rho added), fits the setting's budget (a setting without a
    # budget then needs a rho). The DP choice of the checkpoint reads the validation rows, disjoint from
    # the training rows under the honest protocol, so it costs in parallel.
    rho: Positive | None = None
    # Equal-width bins of a continuous column's public bounds (plus one cell per declared point mass).
    bins: Annotated[int, Strict(), Field(ge=1, le=1000)] = 20
    # Share of rho spent on every continuous column's fine 1-way histogram (dpsynth.models.marginals.shapes),
    # which places a decoded value inside its cell as the column's rows lie there; the rest runs AIM's rounds.
    shape_share: Beta = 0.1
    # Share of rho (after the shapes) spent on the d 1-way marginals together, before the rounds; the rounds
    # are planned on the rest. 0: each 1-way marginal at the first rounds' std (the paper's: at epsilon 1
    # and T = 16 d that std is about 2.5 times MST's, and the categorical level shares show it). `auto`, or
    # a mapping {noise_fraction, cap}: derived from public facts before any row is read (`OneWayRule`), so
    # a large table of few-level columns leaves its rho to the rounds and a small one of many levels does not.
    one_way_share: Beta | Literal["auto"] | OneWayRule = 0.0
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
    # The weight of each pair of two continuous columns in the workload (every other workload clique
    # weighs 1): a candidate's weight, and so its score, sums the weights of the workload cliques it
    # covers. Above 1 it lifts those pairs against the target's cliques so that rounds measure them; the
    # selection's sensitivity is 2 x the largest candidate weight, so it is paid for in every round.
    numeric_pair_weight: Annotated[float, Strict(), Field(ge=1.0, le=100.0)] = DEFAULT_NUMERIC_PAIR_WEIGHT
    # Each pair of two continuous columns is also a candidate over this many groups of adjacent cells per
    # column, cut at equal shares of the noisy 1-way estimate (models/generators/aim/coarse.py): at its
    # fine cells such a pair's own noise outweighs any error at epsilon 1, so no round would choose it.
    # 0: none (the paper's candidates only).
    numeric_pair_groups: Annotated[int, Strict(), Field(ge=0, le=1000)] = DEFAULT_NUMERIC_PAIR_GROUPS
    # Share of rho (after the shapes) spent on pair rounds before the rounds: one per edge of a tree over
    # the c continuous columns (c - 1), each choosing by the exponential mechanism the pair of continuous
    # columns the model estimates worst and measuring it over `pair_round_groups` groups of cells per
    # column (models/generators/aim/privacy.py). At epsilon 1 the rounds go to the target's cliques and
    # no such pair is measured otherwise. 0: none (the paper's AIM).
    numeric_pair_share: Beta = DEFAULT_NUMERIC_PAIR_SHARE
    # Groups of adjacent cells per column a pair round measures a pair over, cut at equal shares of the
    # noisy 1-way estimate (models/generators/aim/coarse.py); below 2: the pair's own cells.
    pair_round_groups: Annotated[int, Strict(), Field(ge=0, le=1000)] = DEFAULT_PAIR_ROUND_GROUPS
