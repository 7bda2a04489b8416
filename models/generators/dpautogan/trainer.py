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

What this package implements (this module trains; networks.py, autoencoder.py, latent_gan.py,
latent_gaussian.py hold the pieces, sampler.py samples), and where it differs.

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
  `generator_steps` GAN steps of `critic_steps` private critic updates and one generator update each.
  `DPSGDAccountant` (models/privacy/dpsgd_accountant.py) starts in phase 1 at (q1, sigma1), gets
  `begin_phase(q3, sigma3)` before the first critic update, and exactly one `step()` per private update.
  Checkpoints every `checkpoint_every` steps (a step: one autoencoder update, or one GAN step) and at
  the end of phase 1: the release file holds the decoder's and the generator's weights with the epsilon
  so far (SHA-256 sidecar, models/checkpoint_files.py); the training state (kept with its previous
  version) restores every network, optimiser, random stream and the accountant, so a run interrupted in
  either phase resumes from its newest intact state and ends bit for bit where an uninterrupted run
  would (the replayed updates redraw the same secret batches and noise: nothing is queried twice with
  fresh randomness).
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

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from dpsynth.models.checkpoint_files import (
    resume_state,
    save_training_state,
    save_verified,
    write_text_atomic,
)
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.dpautogan.autoencoder import autoencoder_per_example
from dpsynth.models.generators.dpautogan.config import DPAutoGANConfig
from dpsynth.models.generators.dpautogan.latent_gan import critic_per_pair, position_latents
from dpsynth.models.generators.dpautogan.latent_gaussian import (
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
    check_groups,
)
from dpsynth.models.generators.dpsgd import SanitizedGradient, apply_gradient, poisson_batch, sanitize
from dpsynth.models.generators.networks import binary_columns, init_generator_
from dpsynth.models.privacy.secret import PrivacySecret

STATE_FILE = "training_state.pt"
LEDGER_FILE = "ledger.json"
ADJACENCY = "add/remove-one"


@dataclass
class UpdateInfo:
    """One private update (kept in memory only: the drawn batch size is not for publication)."""

    phase: str  # "autoencoder" or "critic"
    real_rows: int


@dataclass
class TrainingResult:
    checkpoints: list[dict]
    seconds: float
    updates: list[UpdateInfo] = field(default_factory=list)


class DPAutoGANTrainer:
    """DP-auto-GAN on encoded rows (values in [-1, 1]; `groups` are the encoder's (start, stop, kind)
    blocks). `run()` trains both phases, resuming from `checkpoint_dir` when a training state is there,
    and returns the ledger of released (decoder, generator) checkpoints with their epsilons."""

    def __init__(
        self,
        data: torch.Tensor,
        groups,
        config: DPAutoGANConfig,
        seed: int,
        secret: PrivacySecret,
        checkpoint_dir: str | Path,
        *,
        delta: float,
        reconstruction_weights: tuple[float, ...] | None = None,
        moment_columns: tuple[int, ...] | None = None,
    ):
        self.config = cfg = config
        self.delta = float(delta)
        self.data = torch.as_tensor(data, dtype=torch.float32)
        n, width = self.data.shape
        self.ae_rate, self.critic_rate = float(cfg.autoencoder_rate), float(cfg.critic_rate)
        # The sanitised sums' divisors: the expected batches q n (never a drawn batch's size).
        self.ae_divisor, self.critic_divisor = self.ae_rate * n, self.critic_rate * n
        self.reconstruction_weights = _reconstruction_weights(reconstruction_weights, width)
        self.loss_weights = (
            None
            if self.reconstruction_weights is None
            else torch.tensor(self.reconstruction_weights, dtype=torch.float32)
        )
        self._binary = set(binary_columns(check_groups(groups, width)))
        self.moment_columns = _moment_columns(moment_columns, cfg, width)
        self.spec = ReleaseSpec(
            width,
            cfg.latent_dim,
            cfg.z_dim,
            cfg.decoder_hidden,
            cfg.generator_hidden,
            cfg.head,
            check_groups(groups, width),
            cfg.level_decoding,
            cfg.latent_model,
        )
        self.dir = Path(checkpoint_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = torch.Generator().manual_seed(int(seed))
        self.autoencoder = Autoencoder(width, cfg.latent_dim, cfg.encoder_hidden, cfg.decoder_hidden, cfg.head, groups)
        self.generator = LatentGenerator(cfg.z_dim, cfg.generator_hidden, cfg.latent_dim)
        self.gaussian = GaussianLatent(cfg.latent_dim)  # fitted by the "gaussian" latent model only
        self.critic = Critic(width if cfg.critic_space == "data" else cfg.latent_dim, cfg.critic_hidden)
        for net in (self.autoencoder, self.generator, self.critic):
            init_generator_(net, "default", self.rng)  # PyTorch's default init, drawn from the seed's stream
        self.sampling_rng = secret.torch("dpautogan-sampling")
        self.noise_rng = secret.torch("dpautogan-noise")
        self.fake_key = secret.seed("dpautogan-fakes")  # `position_latents`: the critic's fakes per row
        self.opt_ae = torch.optim.Adam(self.autoencoder.parameters(), lr=cfg.lr_autoencoder, betas=(0.9, 0.999))
        self.opt_critic = torch.optim.RMSprop(self.critic.parameters(), lr=cfg.lr_critic, alpha=0.99)
        self.opt_g = torch.optim.RMSprop(self.generator.parameters(), lr=cfg.lr_generator, alpha=0.99)
        from dpsynth.models.privacy.dpsgd_accountant import DPSGDAccountant  # here: sampling needs no Opacus

        self.accountant = DPSGDAccountant(self.ae_rate, cfg.autoencoder_noise)
        self.step_index = 0  # autoencoder updates, then GAN steps
        self.ledger: list[dict] = []
        self.resume_notes: list[str] = []

    @property
    def phase(self) -> str:
        return "autoencoder" if self.step_index < self.config.autoencoder_steps else self.config.latent_model

    def released_latent(self) -> nn.Module:
        """What the release file holds under "generator": the GAN's generator, or the fitted Gaussian."""
        return self.gaussian if self.config.latent_model == "gaussian" else self.generator

    # -- phase 1 ---------------------------------------------------------------------------------
    def autoencoder_update(self) -> tuple[int, SanitizedGradient]:
        """One private autoencoder update (encoder and decoder clipped and noised together)."""
        cfg = self.config
        index = poisson_batch(self.data.shape[0], self.ae_rate, self.sampling_rng)
        per_example = autoencoder_per_example(self.autoencoder, self.data[index], self.loss_weights)
        parts = sanitize(per_example, cfg.autoencoder_clip, cfg.autoencoder_noise, self.ae_divisor, self.noise_rng)
        apply_gradient(self.autoencoder, parts.total, self.opt_ae)
        return int(index.numel()), parts

    # -- phase 2 ---------------------------------------------------------------------------------
    def fake_latents(self, n_rows: int) -> torch.Tensor:
        return self.generator(torch.randn(n_rows, self.config.z_dim, generator=self.rng))

    def critic_inputs(self, real_rows: torch.Tensor, fake_latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the critic reads: rows and De(fake) (the paper), or En(rows) and fake latents. The encoder
        and decoder are frozen in phase 2 (fixed functions of phase 1's private outputs)."""
        ae = self.autoencoder
        if self.config.critic_space == "data":
            return real_rows, ae.decoder(fake_latents)
        with torch.no_grad():
            real = ae.encoder(real_rows)
        return real, fake_latents

    def critic_update(self, update: int) -> tuple[int, SanitizedGradient]:
        """Private critic update number `update`: each real example of a Poisson batch paired with the fake
        of its own row position (`position_latents`, so whether one row is sampled changes no other pair
        and advances no stream), each pair's gradient clipped as one vector, one noise draw on the sum."""
        cfg = self.config
        index = poisson_batch(self.data.shape[0], self.critic_rate, self.sampling_rng)
        with torch.no_grad():
            fake_latents = self.generator(position_latents(self.fake_key, update, index, cfg.z_dim))
            real, fake = self.critic_inputs(self.data[index], fake_latents)
        parts = sanitize(
            critic_per_pair(self.critic, real, fake),
            cfg.critic_clip,
            cfg.critic_noise,
            self.critic_divisor,
            self.noise_rng,
        )
        apply_gradient(self.critic, parts.total, self.opt_critic)
        return int(index.numel()), parts

    def generator_update(self) -> float:
        """One ordinary generator step: reads only the (private) critic and the frozen decoder."""
        _, fake = self.critic_inputs(self.data[:0], self.fake_latents(self.config.generator_batch))
        loss = -self.critic(fake).mean()
        grads = torch.autograd.grad(loss, list(self.generator.parameters()))
        for p, g in zip(self.generator.parameters(), grads, strict=False):
            p.grad = g
        self.opt_g.step()
        return float(loss.detach())

    def gaussian_fit(self) -> int:
        """The "gaussian" latent model's one private query: every training row's latent (the frozen
        encoder's) into the Gaussian mechanism (`fit_gaussian_latent`), noise from the run's secret."""
        with torch.no_grad():
            latents = self.autoencoder.encoder(self.data)
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
        targets = private_moments(self.data[:, list(columns)], binary, noise, self.noise_rng, center, width)
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

    # -- one step of either phase ------------------------------------------------------------------
    def step(self) -> list[UpdateInfo]:
        """Phase 1: one private autoencoder update. Phase 2: `critic_steps` private critic updates, then a
        generator update; or the Gaussian's one fit. Exactly one accountant step per private query (the
        fit and the moment query: the Gaussian mechanism, each a sampled Gaussian at rate 1)."""
        cfg = self.config
        done: list[UpdateInfo] = []
        if self.phase == "autoencoder":
            rows, _ = self.autoencoder_update()
            self.accountant.step()
            done.append(UpdateInfo("autoencoder", rows))
        elif self.phase == "gaussian":
            self.accountant.begin_phase(1.0, cfg.latent_noise)
            rows = self.gaussian_fit()
            self.accountant.step()
            done.append(UpdateInfo("gaussian", rows))
            if self.moment_columns is not None and cfg.moment_noise is not None:  # both or neither
                self.accountant.begin_phase(1.0, cfg.moment_noise)
                rows = self.moment_fit()
                self.accountant.step()
                done.append(UpdateInfo("moments", rows))
        else:
            if self.step_index == cfg.autoencoder_steps:
                self.accountant.begin_phase(self.critic_rate, cfg.critic_noise)
            first = (self.step_index - cfg.autoencoder_steps) * cfg.critic_steps
            for j in range(cfg.critic_steps):
                rows, _ = self.critic_update(first + j)
                self.accountant.step()
                done.append(UpdateInfo("critic", rows))
            self.generator_update()
        self.step_index += 1
        return done

    # -- checkpoints -----------------------------------------------------------------------------
    def epsilon(self) -> float:
        """Epsilon (add/remove-one, classic conversion) of all private updates so far, both phases' RDP
        added order by order and converted once (Lemma 1)."""
        return self.accountant.epsilon(self.delta, "classic")

    def _save_checkpoint(self) -> None:
        step, eps = self.step_index, self.epsilon()
        release = self.dir / f"release_{step:06d}.pt"
        digest = save_verified(
            {
                "spec": self.spec.to_dict(),
                "decoder": self.autoencoder.decoder.state_dict(),
                "generator": self.released_latent().state_dict(),
                "step": step,
                "epsilon": eps,
                "delta": self.delta,
                "adjacency": ADJACENCY,
            },
            release,
        )
        self.ledger = [e for e in self.ledger if e["step"] < step] + [
            {
                "step": step,
                "phase": "autoencoder" if step <= self.config.autoencoder_steps else self.config.latent_model,
                "epsilon": eps,
                "release": release.name,
                "sha256": digest,
            }
        ]
        state = {
            "step": step,
            **self._written_for(),
            "autoencoder": self.autoencoder.state_dict(),
            "generator": self.generator.state_dict(),
            "critic": self.critic.state_dict(),
            "gaussian": self.gaussian.state_dict(),
            "opt_ae": self.opt_ae.state_dict(),
            "opt_critic": self.opt_critic.state_dict(),
            "opt_g": self.opt_g.state_dict(),
            "accountant": self.accountant.state_dict(),
            "rng": self.rng.get_state(),
            "sampling_rng": self.sampling_rng.get_state(),
            "noise_rng": self.noise_rng.get_state(),
            "ledger": self.ledger,
        }
        save_training_state(state, self.dir / STATE_FILE)
        write_text_atomic(
            json.dumps(
                {"mechanism": self.accountant.mechanism, "adjacency": ADJACENCY, "checkpoints": self.ledger}, indent=1
            ),
            self.dir / LEDGER_FILE,
        )

    def _written_for(self) -> dict:
        """What a training state must have been written for to be resumed here."""
        return {
            "config": self.config.model_dump(),
            "delta": self.delta,
            "reconstruction_weights": self.reconstruction_weights,
            "moment_columns": self.moment_columns,
            "rows": int(self.data.shape[0]),
        }

    def _load_state(self) -> bool:
        """Resume from the newest intact training state (the latest, else the one before it)."""
        state, self.resume_notes = resume_state(self.dir / STATE_FILE, "step", written_for=self._written_for())
        if state is None:
            return False
        self.step_index = state["step"]
        for name in ("autoencoder", "generator", "critic", "gaussian", "opt_ae", "opt_critic", "opt_g"):
            getattr(self, name).load_state_dict(state[name])
        # The saved history may already be in phase 2: rebuild rather than load into a phase-1 accountant.
        self.accountant = type(self.accountant).from_state_dict(state["accountant"])
        for name in ("rng", "sampling_rng", "noise_rng"):
            getattr(self, name).set_state(state[name])
        self.ledger = state["ledger"]
        return True

    def _checkpoint_due(self) -> bool:
        return self.step_index % self.config.checkpoint_every == 0 or self.step_index in (
            self.config.autoencoder_steps,
            self.config.total_steps,
        )

    def run(
        self,
        stop_after: int | None = None,
        progress: Callable[[int, float], None] | None = None,
        last_step: int | None = None,
    ) -> TrainingResult:
        """Train both phases to `last_step` (default: the end), checkpointing as the module notes say.
        `stop_after` ends the call after that many steps (simulates an interruption). `progress(step,
        epsilon)` at every checkpoint."""
        start = time.perf_counter()
        last = self.config.total_steps if last_step is None else min(int(last_step), self.config.total_steps)
        if not self._load_state():
            self._save_checkpoint()  # step 0: untrained networks cost no privacy
        updates: list[UpdateInfo] = []
        steps = 0
        while self.step_index < last and (stop_after is None or steps < stop_after):
            updates += self.step()
            steps += 1
            if self._checkpoint_due():
                self._save_checkpoint()
                if progress is not None:
                    progress(self.step_index, self.ledger[-1]["epsilon"])
        return TrainingResult(list(self.ledger), time.perf_counter() - start, updates)


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
