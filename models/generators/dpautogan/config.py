"""DP-auto-GAN's profile section `dpautogan`: the autoencoder phase, then the WGAN phase whose critic is
DP-SGD (or one Gaussian fit of the latents). Clipping norms follow the paper's ADULT run's scale; every
sampling rate is a fixed public number (the accountant's inputs never depend on the row count)."""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationInfo, field_validator

from dpsynth.models.config_validation import Count, Hidden, NonNegative, OpenUnit, Positive, Rate, Units
from dpsynth.models.generators.two_phase.config import TwoPhaseConfig


class DPAutoGANConfig(TwoPhaseConfig):
    # Its section in a smoke-sized profile (SectionConfig.smoke): a few dozen private updates per phase.
    smoke = {
        "autoencoder_rate": 0.02,
        "critic_rate": 0.02,
        "autoencoder_steps": 20,
        "generator_steps": 20,
        "checkpoint_every": 10,
    }
    autoencoder_rate: OpenUnit = 0.002
    autoencoder_clip: Positive = 0.1
    autoencoder_noise: Positive = 2.0
    autoencoder_steps: Count = 1500
    critic_rate: OpenUnit = 0.002
    critic_clip: Positive = 0.1
    critic_noise: Positive = 2.0
    generator_steps: Count = 4000
    generator_batch: Count = 128
    checkpoint_every: Count = 250
    latent_dim: Units = 12
    z_dim: Units = 32
    encoder_hidden: Hidden = (64,)
    decoder_hidden: Hidden = (64,)
    generator_hidden: Hidden = (64, 64)
    critic_hidden: Hidden = (64, 32)
    # "data": the critic reads rows (real ones, and the decoded fakes: the paper); "latent": it reads
    # latents (real rows through the frozen encoder, and the generator's output).
    critic_space: Literal["data", "latent"] = "data"
    # Weights of the continuous columns and of the target in the autoencoder's reconstruction loss
    # (every other encoded column weighs 1; 1 and 1 is the paper's plain sum).
    continuous_weight: Positive = 1.0
    target_weight: Positive = 1.0
    # Phase 2: "gan" (the paper) or "gaussian" (one Gaussian-mechanism fit of the latents; the GAN keys
    # are then unused) with noise multiplier `latent_noise`.
    latent_model: Literal["gan", "gaussian"] = "gan"
    latent_noise: Positive = 20.0
    # With the Gaussian latent model: the noise multiplier of one more query, the training rows' first
    # and second moments on the continuous columns and the binary target, which the Gaussian is then
    # fitted to through the decoder (`moment_steps` Adam steps, held near the private fit by
    # `moment_anchor`); null: no moment fit.
    moment_noise: Positive | None = None
    moment_steps: Count = 300
    moment_anchor: NonNegative = 0.001
    # null: the moments of the encoded values; k: of each continuous column centred and scaled to k standard
    # deviations of the rows the private Gaussian decodes to (post-processing), so they fill [-1, 1].
    moment_spread: Positive | None = None
    lr_critic: Rate = 0.005
    lr_generator: Rate = 0.005

    @field_validator("level_decoding")
    @classmethod
    def _needs_softmax(cls, decoding: str, info: ValidationInfo) -> str:
        if decoding == "sample" and info.data.get("head") not in (None, "typed"):
            raise ValueError("sample needs head: typed (its softmax gives each one-hot group's level probabilities)")
        return decoding

    @field_validator("moment_noise")
    @classmethod
    def _needs_gaussian(cls, noise: float | None, info: ValidationInfo) -> float | None:
        if noise is not None and info.data.get("latent_model") not in (None, "gaussian"):
            raise ValueError("a moment fit needs latent_model: gaussian (it moves the fitted Gaussian)")
        return noise

    @property
    def phase2_steps(self) -> int:
        """The GAN's generator steps, or the Gaussian's one fit."""
        return 1 if self.latent_model == "gaussian" else self.generator_steps
