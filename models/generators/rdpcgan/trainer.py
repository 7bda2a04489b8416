"""RDP-CGAN for tables (Torfi, Fox and Reddy 2022, "Differentially private synthetic medical data generation
using convolutional GANs").

What the paper does (sections 4.1-4.4, Algorithms 1-2). Phase 1 pretrains a 1-D convolutional
autoencoder (encoder: strided convolutions, PReLU, Tanh at the end; decoder: transposed convolutions,
PReLU, Sigmoid at the end) with DP-SGD: every example's gradient over encoder AND decoder is clipped to
C and Gaussian noise of standard deviation sigma_ae C is added (the paper insists on privatising both:
the decoder's training runs through the encoder). Phase 2 trains a 1-D convolutional WGAN: the generator
G maps z ~ N(0, I) of size 100 to an encoded row of size 128, which the pretrained decoder turns into a
row; the discriminator D reads rows, real ones and Dec(G(z)). Only D reads the data, so only its
updates are private: each takes a mini-batch of real rows and as many z, pairs them one to one, clips
the gradient of each pair's loss, adds N(0, sigma_gan^2 C^2) noise and updates (n_d critic updates per
generator update). The generator's update -mean D(Dec(G(z))) is post-processing. Privacy: the sampled
Gaussian mechanism's RDP for each phase (Mironov, Talwar and Zhang), the two phases composed by RDP's
composition (Proposition 1) and converted to (epsilon, delta) by Proposition 2 (the classic conversion),
delta = 1e-5; Adam at learning rate 0.005, mini-batches of 64.

What this package implements (this module trains, on models/generators/two_phase/ which it shares with
DP-auto-GAN; networks.py, autoencoder.py, gan.py hold the pieces, sampler.py samples), and where it
differs.

* Batches are Poisson samples at a public rate (q1 for the autoencoder, q2 for the critic), as the
  accountant's analysis needs; the paper's "mini-batch of 64" is a rate of about 64 / n.
* The noise is ONE draw of N(0, (sigma C)^2) per entry on the sum of the clipped gradients, divided by the
  expected batch q n (models/generators/dpsgd.py `clipped_sum`, `noisy_mean`). The paper's Algorithms
  write one draw per microbatch, averaged: that is more noise (sigma sqrt(r) on the sum) than the sigma its
  accountant composes, so the accountant's figure holds for it too; here the noise is exactly the accountant's.
* The composition is RDP's at every order (phase 1's curve plus phase 2's, then one conversion): the
  paper's Proposition 1. Its section 4.4 procedure for "fixing alpha" (taking one phase's optimal order
  for both) gives a number at least as large as the minimum over orders of the summed curve.
* The WGAN signs are the consistent ones: the critic minimises D(fake) - D(real), the generator
  -D(fake). (Algorithm 2's critic loss D(x) - D(Dec(G(z))) with the generator loss -D(Dec(G(z))) pushes
  the fakes away from the real rows.) Each real row's fake is made from its own row position's z
  (two_phase/pairs.py's `position_latents`: whether one row is sampled moves no other pair and advances no stream).
* The encoder does not read the target column (`rdpcgan.autoencoder_target: predict`, the default; it
  gets zeros there): the decoder reconstructs the target from the other columns, so a decoded row's
  target follows its features, and the release draws it from the decoder's probabilities. The paper's
  encoder reads every column ("read"): its decoder then carries the target as a coordinate of its own
  and phase 2 must learn the target's dependence on the features through the noisy critic alone, which
  it did not at epsilon 1 on generated tables (docs/generators.md). Each row's gradient still reads only
  that row.
* The decoder ends in GS-WGAN's output head on dpsynth's [-1, 1] encoding (Tanh per column, a softmax per
  one-hot group) instead of a Sigmoid on [0, 1] data; the reconstruction loss is the paper's MSE (its
  supervised experiments) or BCE (its binary-data experiments), `rdpcgan.reconstruction`.
* The critic reads relaxed fakes (`critic_fakes: relaxed`, the default): each decoded fake's one-hot
  groups are Gumbel-softmax draws (temperature 0.2) and its binary columns relaxed Bernoulli draws of
  the levels the release samples from the decoder (`level_decoding: sample`), continuous columns as
  decoded. The paper's critic reads the decoder's Sigmoid output as it is; on a mixed table that output
  is soft where every real row is +-1, so the critic scores softness, the generator saturates each
  discrete column at whichever level is nearest, and a saturated softmax has no gradient to leave it
  (measured without privacy on a generated Cardio-like table: the target's share went to 0.07 or 0.99
  and back). The relaxation's uniforms of a critic update come from the same per-(update, position)
  counter stream as the fake's z (the normal CDF of the entries after z), the generator step's from
  the seed: neither reads data, and each pair still moves the clipped sum by at most C2.
* No BatchNorm (the paper's generator and critic use it): per-example clipping needs a row's gradient not
  to depend on the other rows. The critic's slope is bounded by WGAN-GP's gradient penalty, computed per
  pair at a mix of the pair's own two rows (`critic_penalty`, default 10; gan.py): without a bound the
  critic's scores grow unboundedly and the generator's discrete columns swing between saturated levels.
  The mixing weight comes from the same per-(update, position) stream as the fake's z, so each pair
  still moves the clipped sum by at most C2. `critic_weight_clip` (WGAN's weight clipping,
  post-processing of the private weights) is the older device, off by default: it learnt less.
* The released generator is the running average of the trained one's weights (`generator_ema`,
  decay 0.99 per generator step; post-processing): private GAN training swings from step to step, and
  the average smooths what each checkpoint releases.
* Both phases run in one trainer with one `DPSGDAccountant`, checkpoints and resumption as DP-auto-GAN's
  (models/generators/two_phase/trainer.py): a step is one autoencoder update in phase 1, one generator
  step (with its `critic_steps` private critic updates) in phase 2.

Randomness. Poisson batches ("rdpcgan-sampling"), noise ("rdpcgan-noise") and the critic's fakes'
latents, relaxation uniforms and penalty mixes ("rdpcgan-fakes") come from the run's `PrivacySecret`;
initialisation and the generator step's z and uniforms from the profile seed.

Adjacency. The epsilons recorded here are Opacus's add/remove-one ones ("adjacency": "add/remove-one");
the adapter converts them to replace-one by group privacy (`replace_one_epsilon`), as for DP-auto-GAN.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsynth.models.generators.rdpcgan.autoencoder import autoencoder_per_example
from dpsynth.models.generators.rdpcgan.config import RDPCGANConfig
from dpsynth.models.generators.rdpcgan.gan import critic_per_pair
from dpsynth.models.generators.rdpcgan.networks import Autoencoder, Critic, Generator, ReleaseSpec, init_from_
from dpsynth.models.generators.two_phase.networks import check_groups
from dpsynth.models.generators.two_phase.pairs import position_latents
from dpsynth.models.generators.two_phase.trainer import TwoPhaseTrainer
from dpsynth.models.privacy.secret import PrivacySecret


def predicted_columns(config: RDPCGANConfig, target: tuple[int, int] | None) -> tuple[int, ...]:
    """The encoded columns the encoder does not read: the target's block (`target`: start, stop) under
    `autoencoder_target: predict`, none under "read"."""
    if config.autoencoder_target == "read":
        return ()
    if target is None:
        raise ValueError("rdpcgan.autoencoder_target: predict needs the target's encoded columns")
    return tuple(range(int(target[0]), int(target[1])))


class RDPCGANTrainer(TwoPhaseTrainer):
    """RDP-CGAN on encoded rows (values in [-1, 1]; `groups` are the encoder's (start, stop, kind) blocks).
    `target` is the target column's encoded block (start, stop), which the encoder does not read under
    `autoencoder_target: predict`. `run()` trains both phases, resuming from `checkpoint_dir` when a
    training state is there, and returns the ledger of released (decoder, generator) checkpoints with
    their add/remove-one epsilons."""

    name = "rdpcgan"
    saved = ("released_generator",)
    config: RDPCGANConfig
    critic: Critic

    def __init__(
        self,
        data: np.ndarray | torch.Tensor,
        groups: Sequence[Sequence[Any]],
        config: RDPCGANConfig,
        seed: int,
        secret: PrivacySecret,
        checkpoint_dir: str | Path,
        *,
        delta: float,
        target: tuple[int, int] | None = None,
    ):
        super().__init__(data, config, seed, secret, checkpoint_dir, delta=delta)
        cfg = config
        width = int(self.data.shape[1])
        checked = check_groups(groups, width)
        channels = tuple(cfg.channels)
        self.spec = ReleaseSpec(width, cfg.latent_dim, cfg.z_dim, channels, cfg.head, checked, cfg.level_decoding)
        self.autoencoder = Autoencoder(
            width, cfg.latent_dim, channels, cfg.kernel_size, cfg.head, checked, predicted_columns(cfg, target)
        )
        self.generator = Generator(cfg.z_dim, channels, cfg.latent_dim)
        self.critic = Critic(width, tuple(cfg.critic_channels or channels), cfg.kernel_size)
        for net in (self.autoencoder, self.generator, self.critic):
            init_from_(net, self.rng)
        # The released generator: the running average of the trained one's weights (`generator_ema`),
        # or the trained one itself. Averaging reads only the generator: post-processing.
        self.released_generator = copy.deepcopy(self.generator) if cfg.generator_ema else self.generator
        self.opt_ae = torch.optim.Adam(self.autoencoder.parameters(), lr=cfg.lr_autoencoder)
        self.opt_critic = torch.optim.Adam(self.critic.parameters(), lr=cfg.lr_critic)
        self.opt_g = torch.optim.Adam(self.generator.parameters(), lr=cfg.lr_generator)

    def released_latent(self) -> torch.nn.Module:
        return self.released_generator

    # -- phase 1 ---------------------------------------------------------------------------------
    def autoencoder_gradients(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return autoencoder_per_example(self.autoencoder, rows, self.config.reconstruction)

    # -- phase 2 ---------------------------------------------------------------------------------
    def decoded_fakes(self, z: torch.Tensor, uniforms: torch.Tensor | None = None) -> torch.Tensor:
        """Dec(G(z)): what the critic reads of the generator (the decoder is frozen in phase 2). With
        `critic_fakes: relaxed`, the discrete columns are relaxed draws made from `uniforms` (one per
        encoded column and row)."""
        latents = self.generator(z)
        if self.config.critic_fakes == "probabilities":
            out: torch.Tensor = self.autoencoder.decoder(latents)
            return out
        if uniforms is None:
            raise ValueError("critic_fakes: relaxed needs one uniform per encoded column and fake")
        return self.autoencoder.decoder.relaxed(latents, uniforms)

    def critic_fake_inputs(self, update: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The z, the relaxation's uniforms and the gradient penalty's mixing weight of each sampled row's
        fake in critic update `update`: a fixed function of (secret key, update, row position), so
        whether one row is sampled moves no other pair. The uniforms and the weight are the normal CDF of
        the position's entries after its z."""
        width = int(self.data.shape[1])
        drawn = position_latents(self.fake_key, update, index, self.config.z_dim + width + 1)
        z, normals = drawn[:, : self.config.z_dim], drawn[:, self.config.z_dim :].double()
        uniforms = (0.5 * (1.0 + torch.erf(normals / math.sqrt(2.0)))).float()
        return z, uniforms[:, :width], uniforms[:, width]

    def critic_pair_gradients(
        self, real: torch.Tensor, fake: torch.Tensor, mix: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Each (real, fake) pair's gradient of its critic loss: what one private update clips and sums."""
        return critic_per_pair(self.critic, real, fake, mix, self.config.critic_penalty)

    def pair_gradients(self, update: int, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each real row of the batch paired with the decoded fake of its own row position's z."""
        z, uniforms, mix = self.critic_fake_inputs(update, index)
        with torch.no_grad():
            fake = self.decoded_fakes(z, uniforms)
        return self.critic_pair_gradients(self.data[index], fake, mix)

    def after_critic_update(self) -> None:
        weight_clip = self.config.critic_weight_clip
        if weight_clip is not None:  # post-processing of the private weights
            with torch.no_grad():
                for p in self.critic.parameters():
                    p.clamp_(-weight_clip, weight_clip)

    def generator_fakes(self) -> torch.Tensor:
        z = torch.randn(self.config.generator_batch, self.config.z_dim, generator=self.rng)
        uniforms = torch.rand(self.config.generator_batch, int(self.data.shape[1]), generator=self.rng)
        return self.decoded_fakes(z, uniforms)

    def after_generator_update(self) -> None:
        """The released generator's running average moves towards the trained one."""
        if self.released_generator is not self.generator:
            decay = float(self.config.generator_ema or 0.0)
            with torch.no_grad():
                for avg, p in zip(self.released_generator.parameters(), self.generator.parameters(), strict=True):
                    avg.lerp_(p, 1.0 - decay)
