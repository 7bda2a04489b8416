"""MST's profile section `mst`: its zCDP budget, the cells of a continuous column, and the estimator's
iterations. Delta, the budget, the DP choice and the measured marginals are the shared privacy keys."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict, StrictBool, model_validator

from dpsynth.models.config_validation import Beta, Count, OpenUnit, Positive
from dpsynth.models.generator_section import SectionConfig


class MSTConfig(SectionConfig):
    # MST's whole zCDP (replace-one), split between the 1-way marginals, the tree's selection and the 2-way
    # marginals by the shares below (a third each by default, MST as published). null: the largest rho
    # whose replace-one epsilon, with the profile's measured marginals composed (their rho added), fits
    # the setting's budget (a setting without a budget then needs a rho). The DP choice of the checkpoint
    # reads the validation rows, disjoint from the training rows under the honest protocol, so it costs in
    # parallel (models/privacy/release_choice.py).
    rho: Positive | None = None
    # Equal-width bins of a continuous column's public bounds (plus one cell per declared point mass).
    bins: Annotated[int, Strict(), Field(ge=1, le=1000)] = 20
    # Shares of the fit's rho (after the shapes) spent on the 1-way marginals and on the tree's selection;
    # the 2-way marginals take the rest. The two must leave a share for the 2-way marginals.
    one_way_share: OpenUnit = 1.0 / 3.0
    selection_share: OpenUnit = 1.0 / 3.0
    # Mirror-descent iterations of the estimator (post-processing of the noisy marginals).
    iterations: Count = 2500
    # Not MST as published: each pair's selection score minus the public expected L1 error of its own
    # measurement, so that wide pairs are not chosen for the noise they would add (AIM's idea; the score's
    # sensitivity is unchanged).
    noise_penalty: StrictBool = False
    # Share of rho spent on every continuous column's fine 1-way histogram (dpsynth.models.marginals.shapes),
    # which places a decoded value inside its cell as the column's rows lie there (a heap at a round
    # number stays); the rest is spent as before. 0: values uniform within their cells.
    shape_share: Beta = 0.1

    @model_validator(mode="after")
    def _shares_leave_the_two_way_marginals_some(self) -> MSTConfig:
        if self.one_way_share + self.selection_share >= 1.0:
            raise ValueError(
                f"one_way_share ({self.one_way_share}) and selection_share ({self.selection_share}) must add up "
                "to less than 1: the 2-way marginals take the rest"
            )
        return self
