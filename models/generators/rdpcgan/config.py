"""RDP-CGAN's profile section `rdpcgan`: the autoencoder phase, then the convolutional WGAN phase whose critic
is DP-SGD. The paper's stated values are the defaults: Adam at learning rate 0.005 for every network,
mini-batches of 64 (here a public Poisson rate of 0.001, about 64 rows of a Cardio-sized training table:
the accountant's inputs never depend on the row count), a generator noise of 100 entries and an encoded
row (the generator's output, the decoder's input) of 128, five convolutional layers in the encoder and
the critic, the MSE reconstruction loss of its supervised experiments. The paper states no clipping
norm, noise multiplier, step count or critic updates per generator step: those defaults are ours, as are
the departures that make the model learn on a narrow mixed table (chosen on generated Cardio-like tables
without privacy, then with it; docs/generators.md gives the figures):

* two convolutional layers, not five (`channels`): the paper's five strided layers were sized for rows
  of about a thousand encoded columns; on a 16-column row they shrink it to length one and the
  autoencoder reconstructs every discrete column but no continuous one (R^2 about 0 against 0.99 with
  two layers, without privacy);
* the encoder does not read the target column (`autoencoder_target: predict`): the decoder predicts it
  from the other columns, so released rows' targets follow their features;
* the GAN phase: the critic reads relaxed draws of the fakes' levels (`critic_fakes`), keeps its slope
  bounded by WGAN-GP's per-pair gradient penalty (`critic_penalty`) rather than weight clipping, the
  critic learns at 0.0005 and the generator at 0.0001 (the paper's 0.005 is unstable for a WGAN), and
  the released generator is the running average of its weights (`generator_ema`)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import model_validator

from dpsynth.models.config_validation import Count, Hidden, NonNegative, OpenUnit, Positive, Rate, Units
from dpsynth.models.generators.two_phase.config import TwoPhaseConfig


class RDPCGANConfig(TwoPhaseConfig):
    # Its section in a smoke-sized profile (SectionConfig.smoke): a few dozen private updates per phase,
    # narrow convolutions.
    smoke = {
        "autoencoder_rate": 0.02,
        "critic_rate": 0.02,
        "autoencoder_steps": 20,
        "generator_steps": 20,
        "critic_steps": 2,
        "checkpoint_every": 10,
        "channels": (4, 8, 8),
    }
    autoencoder_rate: OpenUnit = 0.001
    autoencoder_clip: Positive = 1.0
    autoencoder_noise: Positive = 1.5
    autoencoder_steps: Count = 2000
    critic_rate: OpenUnit = 0.001
    critic_clip: Positive = 1.0
    critic_noise: Positive = 1.5
    generator_steps: Count = 2000
    generator_batch: Count = 64
    checkpoint_every: Count = 100
    z_dim: Units = 100
    latent_dim: Units = 128
    # Output channels of the encoder's (and the critic's) 1-D convolutions, one layer each, every layer
    # halving the length; the decoder and the generator use them in reverse order. Two layers: see above
    # (the paper's five, e.g. (8, 16, 32, 32, 64), suit rows of hundreds of encoded columns).
    channels: Hidden = (16, 32)
    # The critic's own channels (null: `channels`). Its DP-SGD noise has one entry per weight, so a
    # narrower critic has less noise in each update for the same privacy.
    critic_channels: Hidden | None = None
    kernel_size: Units = 3
    # What the autoencoder's encoder reads of the target column: "predict" (default), nothing: the
    # decoder reconstructs the target from the other columns, so a decoded row's target follows its
    # features; "read", every column (the paper's). Phase 2 learns dependence slowly: its critic sees a
    # target and a feature together only through noisy updates. On a generated table whose balanced
    # target rests on one narrow, spiky measurement, "read" gave released rows a target unrelated to
    # their features (AUC 0.50-0.54 through epsilon 1) and "predict" 0.68-0.69 (real rows 0.78).
    autoencoder_target: Literal["predict", "read"] = "predict"
    # "mse": the paper's loss in its supervised experiments (Eq. 2); "bce": its binary-data loss (Eq. 1),
    # on values scaled to [0, 1].
    reconstruction: Literal["mse", "bce"] = "mse"
    # What the critic reads of a fake's discrete columns: "relaxed", a Gumbel-softmax / relaxed Bernoulli
    # draw of the level the release would sample (hard-looking, like the real rows' +-1 values), or
    # "probabilities", the decoder's output as it is (the paper's: a soft row the critic tells from a real
    # one by its softness alone, which drives every discrete column to one saturated level).
    critic_fakes: Literal["relaxed", "probabilities"] = "relaxed"
    # The critic's slope must be bounded (DP clipping bounds each update, not the slope): without a bound
    # its scores grow and the generator's discrete columns swing from one saturated level to another.
    # `critic_penalty`: WGAN-GP's weight of each pair's gradient penalty (0: none). Without privacy on a
    # generated Cardio-like table it took the AUC of the released rows from 0.75 to 0.78 and the mean
    # 1-way TVD from 0.14 to 0.09 over weight clipping at 0.1, after 1,000 generator steps.
    critic_penalty: NonNegative = 10.0
    # WGAN's weight clipping of the critic after each update (post-processing of the private weights);
    # null: none. The device before the penalty: 0.1 kept the discrete shares near the real ones on
    # generated tables, 0.01 froze a five-layer critic.
    critic_weight_clip: Positive | None = None
    # The released generator is the exponential moving average of the trained one's weights with this
    # decay per generator step (null: the trained weights as they are), as GS-WGAN's `gan.generator_ema`.
    # Private GAN training swings from step to step; the average is post-processing of the generator,
    # which reads no row.
    generator_ema: OpenUnit | None = 0.99
    lr_critic: Rate = 0.0005
    # The generator learns slower than the critic: at 0.0005 under privacy it swung between rows whose
    # target followed the features (AUC 0.74) and rows whose target did not (0.50) from one checkpoint to
    # the next on generated tables; at 0.0001, with five critic updates per step, it moved steadily.
    lr_generator: Rate = 0.0001

    @model_validator(mode="after")
    def _needs_softmax(self) -> Self:
        # After the whole section (the default "sample" too), so that head: tanh alone is refused.
        if self.level_decoding == "sample" and self.head != "typed":
            raise ValueError(
                "level_decoding: sample needs head: typed (its softmax gives each one-hot group's level "
                "probabilities); set level_decoding: argmax"
            )
        if self.critic_penalty == 0.0 and self.critic_weight_clip is None:
            raise ValueError(
                "the critic needs a bound on its slope: set critic_penalty (WGAN-GP) or critic_weight_clip"
            )
        if self.critic_fakes == "relaxed" and self.head != "typed":
            raise ValueError("critic_fakes: relaxed needs head: typed (it draws from the softmax's levels)")
        return self
