"""The profile-section fields both two-phase generators read, their checks and step counts. Each
generator's config.py gives the defaults (its paper's, or ours where the paper states none) and adds
its own fields. Every sampling rate is a fixed public number: the accountant's inputs never depend on
the row count."""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationInfo, field_validator

from dpsynth.models.config_validation import Count, OpenUnit, Positive, Rate, Units, checkpoints_fit
from dpsynth.models.generator_section import SectionConfig


class TwoPhaseConfig(SectionConfig):
    # Phase 1, the autoencoder's DP-SGD: Poisson rate q1, clipping norm C1, noise multiplier sigma1.
    autoencoder_rate: OpenUnit
    autoencoder_clip: Positive
    autoencoder_noise: Positive
    autoencoder_steps: Count
    # Phase 2, the critic's DP-SGD (q2, C2, sigma2), `critic_steps` critic updates per generator step.
    critic_rate: OpenUnit
    critic_clip: Positive
    critic_noise: Positive
    critic_steps: Count = 5
    generator_steps: Count
    generator_batch: Count
    checkpoint_every: Count
    z_dim: Units
    latent_dim: Units
    head: Literal["tanh", "typed"] = "typed"
    # How a sampled row's discrete columns become levels: the decoder's most likely level ("argmax"), or
    # a level drawn from its probabilities ("sample": rare levels keep their share).
    level_decoding: Literal["argmax", "sample"] = "sample"
    lr_autoencoder: Rate = 0.005
    lr_critic: Rate
    lr_generator: Rate

    @field_validator("checkpoint_every")
    @classmethod
    def _fits(cls, every: int, info: ValidationInfo) -> int:
        total = (info.data.get("autoencoder_steps") or 0) + (info.data.get("generator_steps") or 0)
        return checkpoints_fit(every, total or None, "steps")

    @property
    def phase2_steps(self) -> int:
        """Phase 2's steps: the GAN's generator steps."""
        return self.generator_steps

    @property
    def total_steps(self) -> int:
        return self.autoencoder_steps + self.phase2_steps
