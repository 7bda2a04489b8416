"""DP-CGAN's profile section `dpcgan`: the paper's clipping norm, the discriminator's per-row Poisson rate q
(public: the expected batch is q times the training rows), a noise multiplier and step count that reach
epsilon 1 to 3 on a table of tens of thousands of rows. Delta, the budget and the DP choice are the
shared privacy keys."""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationInfo, field_validator

from dpsynth.models.config_validation import (
    Beta,
    Count,
    Hidden,
    OpenUnit,
    Positive,
    Rate,
    Units,
    checkpoints_fit,
)
from dpsynth.models.generator_section import SectionConfig


class DPCGANConfig(SectionConfig):
    # Its section in a smoke-sized profile (SectionConfig.smoke): a few dozen private updates, at a rate that
    # gives batches of tens of rows from the smoke profile's ~2,400 training rows.
    smoke = {"sample_rate": 0.02, "iterations": 40, "checkpoint_every": 20}
    sample_rate: OpenUnit = 0.002
    clip: Positive = 1.1
    noise_multiplier: Positive = 2.0
    iterations: Count = 8000
    checkpoint_every: Count = 400
    z_dim: Units = 32
    generator_hidden: Hidden = (128, 128)
    discriminator_hidden: Hidden = (128,)
    head: Literal["tanh", "typed", "gumbel"] = "gumbel"
    # "sgd" is the paper's; "adam" is post-processing of the same sanitised gradients.
    discriminator_optimizer: Literal["sgd", "adam"] = "adam"
    lr_discriminator: Rate = 2e-4
    lr_generator: Rate = 2e-4
    betas: tuple[Beta, Beta] = (0.5, 0.999)
    # Public share of target label 1 among generated rows (the paper's prior p_l), never measured.
    label_prior: OpenUnit = 0.5

    @field_validator("checkpoint_every")
    @classmethod
    def _fits(cls, every: int, info: ValidationInfo) -> int:
        iterations = info.data.get("iterations")
        if iterations is not None and every > iterations:
            raise ValueError(f"must be at most iterations ({iterations}) (got {every})")
        return checkpoints_fit(every, iterations, "iterations")
