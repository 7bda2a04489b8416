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

What this package implements (this module trains; networks.py, autoencoder.py, gan.py hold the pieces,
sampler.py samples), and where it differs.

* Batches are Poisson samples at a public rate (q1 for the autoencoder, q2 for the critic), as the
  accountant's analysis needs; the paper's "mini-batch of 64" is a rate of about 64 / n.
* The noise is ONE draw of N(0, (sigma C)^2) per entry on the sum of the clipped gradients, divided by the
  expected batch q n (models/generators/dpsgd.py `sanitize`). The paper's Algorithms write one draw per
  microbatch, averaged: that is more noise (sigma sqrt(r) on the sum) than the sigma its accountant
  composes, so the accountant's figure holds for it too; here the noise is exactly the accountant's.
* The composition is RDP's at every order (phase 1's curve plus phase 2's, then one conversion): the
  paper's Proposition 1. Its section 4.4 procedure for "fixing alpha" (taking one phase's optimal order
  for both) gives a number at least as large as the minimum over orders of the summed curve.
* The WGAN signs are the consistent ones: the critic minimises D(fake) - D(real), the generator
  -D(fake). (Algorithm 2's critic loss D(x) - D(Dec(G(z))) with the generator loss -D(Dec(G(z))) pushes
  the fakes away from the real rows.) Each real row's fake is made from its own row position's z
  (dpautogan's `position_latents`: whether one row is sampled moves no other pair and advances no stream).
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
* Both phases run in one trainer with one `DPSGDAccountant` (models/privacy/dpsgd_accountant.py): phase 1 at
  (q1, sigma1), `begin_phase(q2, sigma2)` before the first critic update, one `step()` per private
  update. A step is one autoencoder update in phase 1, one generator step (with its `critic_steps`
  private critic updates) in phase 2. Checkpoints every `checkpoint_every` steps and at the end of phase
  1: the release file holds the decoder's and the generator's weights (SHA-256 sidecar); the training
  state restores every network, optimiser, random stream and the accountant, so an interrupted run
  resumes from its newest intact state and ends bit for bit where an uninterrupted run would.

Randomness. Poisson batches ("rdpcgan-sampling"), noise ("rdpcgan-noise") and the critic's fakes'
latents, relaxation uniforms and penalty mixes ("rdpcgan-fakes") come from the run's `PrivacySecret`;
initialisation and the generator step's z and uniforms from the profile seed.

Adjacency. The epsilons recorded here are Opacus's add/remove-one ones ("adjacency": "add/remove-one");
the adapter converts them to replace-one by group privacy (`replace_one_epsilon`), as for DP-auto-GAN.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dpsynth.models.checkpoint_files import resume_state, save_training_state, save_verified, write_text_atomic
from dpsynth.models.generators.dpautogan.latent_gan import position_latents
from dpsynth.models.generators.dpsgd import SanitizedGradient, apply_gradient, poisson_batch, sanitize
from dpsynth.models.generators.rdpcgan.autoencoder import autoencoder_per_example
from dpsynth.models.generators.rdpcgan.config import RDPCGANConfig
from dpsynth.models.generators.rdpcgan.gan import critic_per_pair
from dpsynth.models.generators.rdpcgan.networks import (
    Autoencoder,
    Critic,
    Generator,
    ReleaseSpec,
    check_groups,
    init_from_,
)
from dpsynth.models.privacy.dpsgd_accountant import DPSGDAccountant
from dpsynth.models.privacy.secret import PrivacySecret

STATE_FILE = "training_state.pt"
LEDGER_FILE = "ledger.json"
ADJACENCY = "add/remove-one"
NETWORKS = ("autoencoder", "generator", "critic", "opt_ae", "opt_critic", "opt_g")
STREAMS = ("rng", "sampling_rng", "noise_rng")


@dataclass
class UpdateInfo:
    """One private update (kept in memory only: the drawn batch size is not for publication)."""

    phase: str  # "autoencoder" or "critic"
    real_rows: int


@dataclass
class TrainingResult:
    checkpoints: list[dict[str, Any]]
    seconds: float
    updates: list[UpdateInfo] = field(default_factory=list)


def predicted_columns(config: RDPCGANConfig, target: tuple[int, int] | None) -> tuple[int, ...]:
    """The encoded columns the encoder does not read: the target's block (`target`: start, stop) under
    `autoencoder_target: predict`, none under "read"."""
    if config.autoencoder_target == "read":
        return ()
    if target is None:
        raise ValueError("rdpcgan.autoencoder_target: predict needs the target's encoded columns")
    return tuple(range(int(target[0]), int(target[1])))


class RDPCGANTrainer:
    """RDP-CGAN on encoded rows (values in [-1, 1]; `groups` are the encoder's (start, stop, kind) blocks).
    `target` is the target column's encoded block (start, stop), which the encoder does not read under
    `autoencoder_target: predict`. `run()` trains both phases, resuming from `checkpoint_dir` when a
    training state is there, and returns the ledger of released (decoder, generator) checkpoints with
    their add/remove-one epsilons."""

    def __init__(
        self,
        data: torch.Tensor,
        groups: Sequence[Sequence[Any]],
        config: RDPCGANConfig,
        seed: int,
        secret: PrivacySecret,
        checkpoint_dir: str | Path,
        *,
        delta: float,
        target: tuple[int, int] | None = None,
    ):
        self.config = cfg = config
        self.delta = float(delta)
        self.data = torch.as_tensor(data, dtype=torch.float32)
        n, width = self.data.shape
        groups = check_groups(groups, width)
        self.ae_rate, self.critic_rate = float(cfg.autoencoder_rate), float(cfg.critic_rate)
        # The sanitised sums' divisors: the expected batches q n (never a drawn batch's size).
        self.ae_divisor, self.critic_divisor = self.ae_rate * n, self.critic_rate * n
        channels = tuple(cfg.channels)
        self.spec = ReleaseSpec(width, cfg.latent_dim, cfg.z_dim, channels, cfg.head, groups, cfg.level_decoding)
        self.dir = Path(checkpoint_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = torch.Generator().manual_seed(int(seed))
        self.autoencoder = Autoencoder(
            width, cfg.latent_dim, channels, cfg.kernel_size, cfg.head, groups, predicted_columns(cfg, target)
        )
        self.generator = Generator(cfg.z_dim, channels, cfg.latent_dim)
        self.critic = Critic(width, tuple(cfg.critic_channels or channels), cfg.kernel_size)
        for net in (self.autoencoder, self.generator, self.critic):
            init_from_(net, self.rng)
        # The released generator: the running average of the trained one's weights (`generator_ema`),
        # or the trained one itself. Averaging reads only the generator: post-processing.
        self.released_generator = copy.deepcopy(self.generator) if cfg.generator_ema else self.generator
        self.sampling_rng = secret.torch("rdpcgan-sampling")
        self.noise_rng = secret.torch("rdpcgan-noise")
        self.fake_key = secret.seed("rdpcgan-fakes")
        self.opt_ae = torch.optim.Adam(self.autoencoder.parameters(), lr=cfg.lr_autoencoder)
        self.opt_critic = torch.optim.Adam(self.critic.parameters(), lr=cfg.lr_critic)
        self.opt_g = torch.optim.Adam(self.generator.parameters(), lr=cfg.lr_generator)
        self.accountant = DPSGDAccountant(self.ae_rate, cfg.autoencoder_noise)
        self.step_index = 0  # autoencoder updates, then GAN steps
        self.ledger: list[dict[str, Any]] = []
        self.resume_notes: list[str] = []

    @property
    def phase(self) -> str:
        return "autoencoder" if self.step_index < self.config.autoencoder_steps else "gan"

    # -- phase 1 ---------------------------------------------------------------------------------
    def autoencoder_update(self) -> tuple[int, SanitizedGradient]:
        """One private autoencoder update (encoder and decoder clipped and noised together)."""
        cfg = self.config
        index = poisson_batch(self.data.shape[0], self.ae_rate, self.sampling_rng)
        per_example = autoencoder_per_example(self.autoencoder, self.data[index], cfg.reconstruction)
        parts = sanitize(per_example, cfg.autoencoder_clip, cfg.autoencoder_noise, self.ae_divisor, self.noise_rng)
        apply_gradient(self.autoencoder, parts.total, self.opt_ae)
        return int(index.numel()), parts

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

    def critic_update(self, update: int) -> tuple[int, SanitizedGradient]:
        """Private critic update number `update`: each real row of a Poisson batch paired with the decoded
        fake of its own row position's z, each pair's gradient clipped as one vector, one noise draw."""
        cfg = self.config
        index = poisson_batch(self.data.shape[0], self.critic_rate, self.sampling_rng)
        z, uniforms, mix = self.critic_fake_inputs(update, index)
        with torch.no_grad():
            fake = self.decoded_fakes(z, uniforms)
        parts = sanitize(
            self.critic_pair_gradients(self.data[index], fake, mix),
            cfg.critic_clip,
            cfg.critic_noise,
            self.critic_divisor,
            self.noise_rng,
        )
        apply_gradient(self.critic, parts.total, self.opt_critic)
        if cfg.critic_weight_clip is not None:  # post-processing of the private weights
            with torch.no_grad():
                for p in self.critic.parameters():
                    p.clamp_(-cfg.critic_weight_clip, cfg.critic_weight_clip)
        return int(index.numel()), parts

    def generator_update(self) -> float:
        """One ordinary generator step: reads only the (private) critic and the frozen decoder."""
        z = torch.randn(self.config.generator_batch, self.config.z_dim, generator=self.rng)
        uniforms = torch.rand(self.config.generator_batch, int(self.data.shape[1]), generator=self.rng)
        loss = -self.critic(self.decoded_fakes(z, uniforms)).mean()
        grads = torch.autograd.grad(loss, list(self.generator.parameters()))
        for p, g in zip(self.generator.parameters(), grads, strict=True):
            p.grad = g
        self.opt_g.step()
        if self.released_generator is not self.generator:
            decay = float(self.config.generator_ema or 0.0)
            with torch.no_grad():
                for avg, p in zip(self.released_generator.parameters(), self.generator.parameters(), strict=True):
                    avg.lerp_(p, 1.0 - decay)
        return float(loss.detach())

    def step(self) -> list[UpdateInfo]:
        """Phase 1: one private autoencoder update. Phase 2: `critic_steps` private critic updates, then a
        generator update. Exactly one accountant step per private update."""
        cfg = self.config
        done: list[UpdateInfo] = []
        if self.phase == "autoencoder":
            rows, _ = self.autoencoder_update()
            self.accountant.step()
            done.append(UpdateInfo("autoencoder", rows))
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
        added order by order and converted once."""
        return self.accountant.epsilon(self.delta, "classic")

    def _save_checkpoint(self) -> None:
        step, eps = self.step_index, self.epsilon()
        release = self.dir / f"release_{step:06d}.pt"
        digest = save_verified(
            {
                "spec": self.spec.to_dict(),
                "decoder": self.autoencoder.decoder.state_dict(),
                "generator": self.released_generator.state_dict(),
                "step": step,
                "epsilon": eps,
                "delta": self.delta,
                "adjacency": ADJACENCY,
            },
            release,
        )
        phase = "autoencoder" if step <= self.config.autoencoder_steps else "gan"
        self.ledger = [e for e in self.ledger if e["step"] < step] + [
            {"step": step, "phase": phase, "epsilon": eps, "release": release.name, "sha256": digest}
        ]
        state: dict[str, Any] = {"step": step, **self._written_for(), "ledger": self.ledger}
        state.update({name: getattr(self, name).state_dict() for name in NETWORKS})
        state["released_generator"] = self.released_generator.state_dict()
        state.update({name: getattr(self, name).get_state() for name in STREAMS})
        state["accountant"] = self.accountant.state_dict()
        save_training_state(state, self.dir / STATE_FILE)
        write_text_atomic(
            json.dumps(
                {"mechanism": self.accountant.mechanism, "adjacency": ADJACENCY, "checkpoints": self.ledger}, indent=1
            ),
            self.dir / LEDGER_FILE,
        )

    def _written_for(self) -> dict[str, Any]:
        """What a training state must have been written for to be resumed here."""
        return {"config": self.config.model_dump(), "delta": self.delta, "rows": int(self.data.shape[0])}

    def _load_state(self) -> bool:
        """Resume from the newest intact training state (the latest, else the one before it)."""
        state, self.resume_notes = resume_state(self.dir / STATE_FILE, "step", written_for=self._written_for())
        if state is None:
            return False
        self.step_index = state["step"]
        for name in NETWORKS:
            getattr(self, name).load_state_dict(state[name])
        if self.released_generator is not self.generator:
            self.released_generator.load_state_dict(state["released_generator"])
        for name in STREAMS:
            getattr(self, name).set_state(state[name])
        # The saved history may already be in phase 2: rebuild rather than load into a phase-1 accountant.
        self.accountant = DPSGDAccountant.from_state_dict(state["accountant"])
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
        """Train both phases to `last_step` (default: the end). `stop_after` ends the call after that many
        steps (simulates an interruption). `progress(step, epsilon)` at every checkpoint."""
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
