"""DP-auto-GAN for tables (Tantipongpipat, Waites, Boob, Siva and Cummings).

What the paper does (Algorithms 2-5, section 3). Two phases, both reading the data through DP-SGD.
Phase 1 trains an autoencoder En: R^n -> R^d, De: R^d -> R^n on the reconstruction loss (binary cross
entropy summed over the encoded columns, data scaled to [0, 1]): Poisson batches with probability q1,
each example's gradient clipped to C1, N(0, C1^2 psi1^2) added to the sum, divided by the expected batch
q1 m. Phase 2 trains a WGAN whose generator G: z -> R^d writes *latent* vectors; the fixed decoder maps
them to rows, and the discriminator D: R^n -> R reads rows: real rows and De(G(z)) (Algorithm 4: "B' <-
{De(G_w(z_i))}", the ADULT critic's input width is the data width, 106). Each critic update is one DP-SGD
query: a Poisson batch with probability q3; for each real example j (microbatch size 1) one fresh z_j,
and the gradient of the WGAN loss of the PAIR, g_j = grad_y [D(De(G(z_j))) - D(x_j)], is clipped to C3
as a whole; the clipped g_j are summed, N(0, C3^2 psi3^2) added, and divided by q3 m. t_D critic updates
per generator step; the generator's step (-mean D(De(G(z)))) reads no data and is not private. Privacy
(Lemma 1): the autoencoder's RDP (T1 steps at q1, psi1) and the critic's (T2 t_D steps at q3, psi3) are
added order by order and converted once. De and G are released; En and D are not.

What this package implements (this module trains, on models/generators/two_phase/ which it shares with
RDP-CGAN; networks.py, autoencoder.py, latent_gaussian.py hold the pieces, sampler.py samples), and where
it differs.

* Phase 1 clips and noises the gradient of ALL autoencoder weights, encoder and decoder together (one
  joint per-example norm). Algorithm 3 (lines 9-10) uses the encoder's gradient without clipping or
  noise, saying the encoder "can be trained non-privately" because it is not released. That does not
  hold: the decoder's later updates are computed through the encoder, so a non-private encoder carries
  the data into the released decoder outside any accounted query (adaptive composition needs every
  earlier state to be a function of earlier private outputs). The paper's own Fig. 1 and section 3.3
  ("adding noise to the encoder, decoder, and discriminator") agree with what is done here.
* Phase 2's critic is the paper's by default (`critic_space="data"`: D reads rows; real rows as they
  are, fakes as De(G(z))). `critic_space="latent"` is offered because dpsynth's design notes describe a
  latent critic: D reads latents; the real rows are encoded by the encoder trained in phase 1, FROZEN
  (not updated in phase 2; a fixed function of phase 1's private outputs, so encoding a row inside the
  critic query is per-row post-processing and each pair still moves the sum by at most C3), and fakes
  are G(z). Either way the encoder and decoder do not change in phase 2.
* The critic query is implemented as the paper has it: the real term and the fake term of a pair are
  clipped TOGETHER (one norm per real example), with exactly one fake per real example of the Poisson
  batch (an empty batch has no pairs and still gets its noise); one N(0, sigma^2 C^2) draw on the sum;
  divided by the expected batch. (DP-CGAN, models/generators/dpcgan/trainer.py, instead clips real and fake separately.)
* The WGAN signs are the consistent ones: the critic minimises D(fake) - D(real), the generator
  -D(fake). (Algorithm 4's L_D is written with the opposite sign to Algorithm 5's L_G.) No Lipschitz
  constraint (no gradient penalty or weight clipping), as in the paper: only the DP clipping limits a
  critic update.
* Networks: fully connected, LayerNorm and LeakyReLU(0.2) in hidden layers (no BatchNorm anywhere: the
  paper's generators use BatchNorm, but a row's output should not depend on its batch, and the private
  modules must pass Opacus's ModuleValidator); the encoder and the generator end in Tanh so that real
  and generated latents share the range [-1, 1]; the decoder ends in GS-WGAN's `OutputHead`
  (models/generators/networks.py; "typed": Tanh per single column, softmax per one-hot group mapped to [-1, 1]) so
  decoded categorical groups are valid distributions. The reconstruction loss is the paper's BCE on
  (x + 1) / 2. Optimisers as in the paper's ADULT run: Adam for the autoencoder, RMSprop (alpha 0.99)
  for critic and generator. The ADULT generator's residual blocks are not reproduced.
* `DPAutoGANTrainer.run` performs `autoencoder_steps` private autoencoder updates, then
  `generator_steps` GAN steps of `critic_steps` private critic updates and one generator update each,
  with one accountant, checkpoints and resumption as RDP-CGAN's: models/generators/two_phase/trainer.py.
* `sample_encoded(decoder, generator, n, seed, level_decoding=...)`: z ~ N(0, I) -> G -> De -> rows in
  [-1, 1]; with "sample" (`dpautogan.level_decoding`, the default) each discrete column then gets a
  level drawn from the decoder's probabilities (a one-hot group's softmax, a binary column's (x + 1) /
  2), so a rare level keeps its share instead of losing every argmax. Post-processing: no privacy cost.

Randomness. Poisson batches ("dpautogan-sampling") and noise ("dpautogan-noise") come from the run's
`PrivacySecret` (models/privacy/secret.py); initialisation and the generator's z from the profile seed.

Adjacency. Opacus's RDP analysis of the sampled Gaussian mechanism, used
by the accountant, holds under add/remove-one adjacency. dpsynth's unit of privacy elsewhere (GS-WGAN's
accountant, the release statement) is replace-one. Replacing a row is a removal then an addition, so an
add/remove (epsilon, delta) gives replace-one only through group privacy of size two, (2 epsilon,
(1 + e^epsilon) delta), or through a separate replace-one analysis (sensitivity 2C);
`dpsynth.models.privacy.dpsgd_accountant.replace_one_epsilon` gives the first. The epsilons recorded here ("adjacency":
"add/remove-one") must not be reported as replace-one, nor their RDP added to a replace-one curve
(models/privacy/lifetime.py).

Beyond the paper, all off by default (profiles choose them; the adapter derives the run values
`reconstruction_weights` and `moment_columns` from the public schema and passes them with delta):
* `reconstruction_weights`: each encoded column's weight in the reconstruction loss (the adapter derives
  them from the public schema: continuous columns and the target). A wide table's many one-hot columns
  otherwise drown its few continuous ones and the target.
* `latent_model="gaussian"`: phase 2 is not a GAN but one Gaussian-mechanism query: every training row's
  latent En(x) in [-1, 1]^d gives (z, upper(z z^T)), of norm at most `gaussian_bound(d)`; their sums get
  N(0, (sigma x bound)^2) per entry, and the release holds the mean and a Cholesky factor of the
  covariance (`GaussianLatent`: z ~ N(mean, covariance) clipped to [-1, 1]). Accounted as one sampled
  Gaussian at rate 1 after the autoencoder's phase (RDP alpha / (2 sigma^2), exact). The GAN's networks
  are then unused.
* `moment_columns` (with the Gaussian latent model): a single Gaussian in the latent space misses the
  rank correlations of the continuous columns (the latents are not Gaussian). One more Gaussian-mechanism
  query measures the training rows' first and second moments on these encoded columns (clipped to
  [-1, 1]; norm at most `moment_bound`), accounted like the fit; then, as post-processing of private
  outputs only, the Gaussian's mean and factor are moved until the decoded rows' expected moments match
  (`match_decoded_moments`). The release format is unchanged. With `moment_spread` each continuous
  column is first centred and scaled by rows drawn from the private Gaussian and decoder (earlier
  private outputs), so its values fill [-1, 1] instead of a small part of the public bounds.

Not done: no private choice of the clipping norms (the paper picked them from a non-private run, which
itself leaks); they are profile values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.dpautogan.autoencoder import autoencoder_clipped_sum, autoencoder_per_example
from dpsynth.models.generators.dpautogan.config import DPAutoGANConfig
from dpsynth.models.generators.dpautogan.latent_gaussian import (
    EncodedLatents,
    fit_gaussian_latent,
    match_decoded_moments,
    moment_spread_from,
    private_moments,
)
from dpsynth.models.generators.dpautogan.networks import (
    Autoencoder,
    Critic,
    GaussianLatent,
    LatentGenerator,
    ReleaseSpec,
)
from dpsynth.models.generators.networks import binary_columns, init_generator_
from dpsynth.models.generators.two_phase.networks import check_groups
from dpsynth.models.generators.two_phase.pairs import critic_pair_clipped_sum, critic_per_pair, position_latents
from dpsynth.models.generators.two_phase.trainer import TwoPhaseTrainer, UpdateInfo
from dpsynth.models.privacy.secret import PrivacySecret


class DPAutoGANTrainer(TwoPhaseTrainer):
    """DP-auto-GAN on encoded rows (values in [-1, 1]; `groups` are the encoder's (start, stop, kind)
    blocks). `run()` trains both phases, resuming from `checkpoint_dir` when a training state is there,
    and returns the ledger of released (decoder, generator) checkpoints with their epsilons."""

    name = "dpautogan"
    saved = ("gaussian",)
    config: DPAutoGANConfig

    def __init__(
        self,
        data: np.ndarray | torch.Tensor,
        groups: Sequence[Sequence[Any]],
        config: DPAutoGANConfig,
        seed: int,
        secret: PrivacySecret,
        checkpoint_dir: str | Path,
        *,
        delta: float,
        reconstruction_weights: tuple[float, ...] | None = None,
        moment_columns: tuple[int, ...] | None = None,
    ):
        super().__init__(data, config, seed, secret, checkpoint_dir, delta=delta)
        cfg = config
        width = int(self.data.shape[1])
        checked = check_groups(groups, width)
        self.reconstruction_weights = _reconstruction_weights(reconstruction_weights, width)
        self.loss_weights = (
            None
            if self.reconstruction_weights is None
            else torch.tensor(self.reconstruction_weights, dtype=torch.float32)
        )
        self._binary = set(binary_columns(checked))
        self.moment_columns = _moment_columns(moment_columns, cfg, width)
        self.spec = ReleaseSpec(
            width,
            cfg.latent_dim,
            cfg.z_dim,
            cfg.decoder_hidden,
            cfg.generator_hidden,
            cfg.head,
            checked,
            cfg.level_decoding,
            cfg.latent_model,
        )
        self.autoencoder = Autoencoder(width, cfg.latent_dim, cfg.encoder_hidden, cfg.decoder_hidden, cfg.head, groups)
        self.generator = LatentGenerator(cfg.z_dim, cfg.generator_hidden, cfg.latent_dim)
        self.gaussian = GaussianLatent(cfg.latent_dim)  # fitted by the "gaussian" latent model only
        self.critic = Critic(width if cfg.critic_space == "data" else cfg.latent_dim, cfg.critic_hidden)
        for net in (self.autoencoder, self.generator, self.critic):
            init_generator_(net, "default", self.rng)  # PyTorch's default init, drawn from the seed's stream
        self.opt_ae = torch.optim.Adam(self.autoencoder.parameters(), lr=cfg.lr_autoencoder, betas=(0.9, 0.999))
        self.opt_critic = torch.optim.RMSprop(self.critic.parameters(), lr=cfg.lr_critic, alpha=0.99)
        self.opt_g = torch.optim.RMSprop(self.generator.parameters(), lr=cfg.lr_generator, alpha=0.99)

    @property
    def latent_phase(self) -> str:
        return self.config.latent_model

    def released_latent(self) -> nn.Module:
        """What the release file holds under "generator": the GAN's generator, or the fitted Gaussian."""
        return self.gaussian if self.config.latent_model == "gaussian" else self.generator

    def written_for_extra(self) -> dict[str, Any]:
        return {"reconstruction_weights": self.reconstruction_weights, "moment_columns": self.moment_columns}

    # -- phase 1 ---------------------------------------------------------------------------------
    def autoencoder_gradients(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        return autoencoder_per_example(self.autoencoder, rows, self.loss_weights)

    def autoencoder_clipped_sum(self, rows: torch.Tensor, clip: float) -> dict[str, torch.Tensor]:
        # The same clipped sum as from autoencoder_gradients, without rows x parameters of per-row gradients.
        return autoencoder_clipped_sum(self.autoencoder, rows, clip, self.loss_weights)

    # -- phase 2 ---------------------------------------------------------------------------------
    def fake_latents(self, n_rows: int) -> torch.Tensor:
        out: torch.Tensor = self.generator(torch.randn(n_rows, self.config.z_dim, generator=self.rng))
        return out

    def critic_inputs(self, real_rows: torch.Tensor, fake_latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the critic reads: rows and De(fake) (the paper), or En(rows) and fake latents. The encoder
        and decoder are frozen in phase 2 (fixed functions of phase 1's private outputs)."""
        ae = self.autoencoder
        if self.config.critic_space == "data":
            return real_rows, ae.decoder(fake_latents)
        with torch.no_grad():
            real = ae.encoder(real_rows)
        return real, fake_latents

    def pair_inputs(self, update: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Critic update `update`'s (real, fake) pairs as the critic reads them, for the sampled rows `index`."""
        with torch.no_grad():
            fake_latents = self.generator(position_latents(self.fake_key, update, index, self.config.z_dim))
            return self.critic_inputs(self.data[index], fake_latents)

    def pair_gradients(self, update: int, index: torch.Tensor) -> dict[str, torch.Tensor]:
        return critic_per_pair(self.critic, *self.pair_inputs(update, index))

    def pair_clipped_sum(self, update: int, index: torch.Tensor, clip: float) -> dict[str, torch.Tensor]:
        # pair_gradients' pairs, clipped and summed without per-pair gradients (the critic is fully connected).
        return critic_pair_clipped_sum(self.critic, *self.pair_inputs(update, index), clip)

    def generator_fakes(self) -> torch.Tensor:
        _, fake = self.critic_inputs(self.data[:0], self.fake_latents(self.config.generator_batch))
        return fake

    def gaussian_fit(self) -> int:
        """The "gaussian" latent model's one private query: every training row's latent (the frozen
        encoder's) into the Gaussian mechanism (`fit_gaussian_latent`), noise from the run's secret."""
        # Encoded a chunk at a time as the fit sums them: every row's latents at once would grow with the rows.
        latents = EncodedLatents(self.data, self.autoencoder.encoder, self.config.latent_dim)
        mean, scale = fit_gaussian_latent(latents, self.config.latent_noise, self.noise_rng)
        self.gaussian.mean.copy_(mean)
        self.gaussian.scale.copy_(scale)
        return int(latents.shape[0])

    def moment_fit(self) -> int:
        """The decoded-moment fit: one private query of the training rows' moments on `moment_columns`
        (`private_moments`, noise from the run's secret), then the Gaussian moved towards them
        (`match_decoded_moments`, post-processing, its draws from the seed's stream)."""
        cfg = self.config
        columns, noise = self.moment_columns, cfg.moment_noise
        if columns is None or noise is None:  # `_moment_columns` gives columns only with a moment noise
            raise ConfigError("a decoded-moment fit needs dpautogan.latent_model gaussian and dpautogan.moment_noise")
        binary = [c in self._binary for c in columns]
        center = width = None
        if cfg.moment_spread is not None:  # from rows the private Gaussian and decoder make: post-processing
            with torch.no_grad():
                z = self.gaussian(torch.randn(16384, cfg.latent_dim, generator=self.rng))
                center, width = moment_spread_from(
                    self.autoencoder.decoder(z)[:, list(columns)], binary, cfg.moment_spread
                )
        targets = private_moments(self.data.columns(list(columns)), binary, noise, self.noise_rng, center, width)
        mean, scale = match_decoded_moments(
            self.autoencoder.decoder,
            self.gaussian.mean,
            self.gaussian.scale,
            columns,
            binary,
            targets,
            cfg.moment_steps,
            cfg.moment_anchor,
            self.rng,
            center=center,
            width=width,
        )
        self.gaussian.mean.copy_(mean)
        self.gaussian.scale.copy_(scale)
        return int(self.data.shape[0])

    def latent_step(self) -> list[UpdateInfo]:
        """Phase 2: a GAN step, or the Gaussian's one fit (and the moment query): each the Gaussian
        mechanism, a sampled Gaussian at rate 1, one accountant step each."""
        cfg = self.config
        if self.phase != "gaussian":
            return super().latent_step()
        self.accountant.begin_phase(1.0, cfg.latent_noise)
        done = [UpdateInfo("gaussian", self.gaussian_fit())]
        self.accountant.step()
        if self.moment_columns is not None and cfg.moment_noise is not None:  # both or neither
            self.accountant.begin_phase(1.0, cfg.moment_noise)
            done.append(UpdateInfo("moments", self.moment_fit()))
            self.accountant.step()
        return done


def _reconstruction_weights(weights, width: int) -> tuple[float, ...] | None:
    """Each encoded column's weight in the reconstruction loss (None: all alike, the paper)."""
    if weights is None:
        return None
    weights = tuple(float(w) for w in weights)
    if len(weights) != width or not all(math.isfinite(w) and w > 0 for w in weights):
        raise ConfigError(
            f"dpautogan reconstruction weights: {width} finite numbers > 0 expected, one per "
            f"encoded column (got {len(weights)})"
        )
    return weights


def _moment_columns(columns, config: DPAutoGANConfig, width: int) -> tuple[int, ...] | None:
    """The encoded columns of the decoded-moment fit (None: no fit), checked against the section."""
    if columns is None:
        return None
    columns = tuple(int(c) for c in columns)
    if config.latent_model != "gaussian" or config.moment_noise is None:
        raise ConfigError("a decoded-moment fit needs dpautogan.latent_model gaussian and dpautogan.moment_noise")
    if not columns or len(set(columns)) != len(columns) or not all(0 <= c < width for c in columns):
        raise ConfigError(f"the moment fit's columns must be distinct encoded columns below {width} (got {columns})")
    return columns
