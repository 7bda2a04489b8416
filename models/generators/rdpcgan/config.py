"""RDP-CGAN's profile section `rdpcgan`: the autoencoder phase, then the convolutional WGAN phase whose critic
is DP-SGD. The paper's stated values are the defaults: Adam at learning rate 0.005 for every network,
mini-batches of 64 (here a public Poisson rate of 0.001, about 64 rows of a Cardio-sized training table:
the accountant's inputs never depend on the row count), a generator noise of 100 entries and an encoded
row (the generator's output, the decoder's input) of 128, five convolutional layers in the encoder and
the critic, the MSE reconstruction loss of its supervised experiments. The paper states no clipping
norm, noise multiplier, step count or critic updates per generator step: those defaults are ours, as are
the two departures that make the GAN phase learn marginals (`critic_fakes`, `critic_weight_clip`)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import ValidationInfo, field_validator, model_validator

from dpsynth.models.config_validation import Count, Hidden, OpenUnit, Positive, Rate, Units, checkpoints_fit
from dpsynth.models.generators.section import SectionConfig


class RDPCGANConfig(SectionConfig):
    autoencoder_rate: OpenUnit = 0.001
    autoencoder_clip: Positive = 1.0
    autoencoder_noise: Positive = 1.5
    autoencoder_steps: Count = 2000
    critic_rate: OpenUnit = 0.001
    critic_clip: Positive = 1.0
    critic_noise: Positive = 1.5
    critic_steps: Count = 5
    generator_steps: Count = 2000
    generator_batch: Count = 64
    checkpoint_every: Count = 100
    z_dim: Units = 100
    latent_dim: Units = 128
    # Output channels of the encoder's (and the critic's) 1-D convolutions, one layer each, every layer
    # halving the length; the decoder and the generator use them in reverse order.
    channels: Hidden = (8, 16, 32, 32, 64)
    kernel_size: Units = 3
    # "mse": the paper's loss in its supervised experiments (Eq. 2); "bce": its binary-data loss (Eq. 1),
    # on values scaled to [0, 1].
    reconstruction: Literal["mse", "bce"] = "mse"
    head: Literal["tanh", "typed"] = "typed"
    # How a sampled row's discrete columns become levels: the decoder's most likely level ("argmax"), or
    # a level drawn from its probabilities ("sample": rare levels keep their share).
    level_decoding: Literal["argmax", "sample"] = "sample"
    # What the critic reads of a fake's discrete columns: "relaxed", a Gumbel-softmax / relaxed Bernoulli
    # draw of the level the release would sample (hard-looking, like the real rows' +-1 values), or
    # "probabilities", the decoder's output as it is (the paper's: a soft row the critic tells from a real
    # one by its softness alone, which drives every discrete column to one saturated level).
    critic_fakes: Literal["relaxed", "probabilities"] = "relaxed"
    # WGAN's weight clipping of the critic after each update (post-processing of the private weights);
    # null: none (the paper names none beyond the WGAN loss). DP clipping bounds each update, not the
    # critic's slope: without a bound the critic's scores grow and the generator's discrete columns swing
    # from one saturated level to another; 0.1 keeps them near the real shares on generated tables
    # (0.01 freezes the five-layer critic: its scores, and the generator's gradient, vanish).
    critic_weight_clip: Positive | None = 0.1
    lr_autoencoder: Rate = 0.005
    lr_critic: Rate = 0.005
    lr_generator: Rate = 0.005

    @model_validator(mode="after")
    def _needs_softmax(self) -> Self:
        # After the whole section (the default "sample" too), so that head: tanh alone is refused.
        if self.level_decoding == "sample" and self.head != "typed":
            raise ValueError(
                "level_decoding: sample needs head: typed (its softmax gives each one-hot group's level "
                "probabilities); set level_decoding: argmax"
            )
        if self.critic_fakes == "relaxed" and self.head != "typed":
            raise ValueError("critic_fakes: relaxed needs head: typed (it draws from the softmax's levels)")
        return self

    @field_validator("checkpoint_every")
    @classmethod
    def _fits(cls, every: int, info: ValidationInfo) -> int:
        total = (info.data.get("autoencoder_steps") or 0) + (info.data.get("generator_steps") or 0)
        return checkpoints_fit(every, total or None, "steps")

    @property
    def total_steps(self) -> int:
        return self.autoencoder_steps + self.generator_steps
