"""`TwoPhaseTrainer`: what DP-auto-GAN's and RDP-CGAN's trainers share (each generator's trainer.py says
what the paper does and where it differs).

Phase 1: `autoencoder_steps` private autoencoder updates (encoder and decoder clipped and noised
together: the decoder's later updates are computed through the encoder). Phase 2: `generator_steps` GAN
steps of `critic_steps` private critic updates (each real row of a Poisson batch paired with the fake of
its own row position, pairs.py) and one ordinary generator update, which reads only the private critic
and the frozen decoder. Each private update draws a Poisson batch at a public rate and adds one
N(0, (sigma C)^2) draw per entry to the sum of the clipped gradients, divided by the expected batch q n
(models/generators/dpsgd.py `noisy_mean`).

One `DPSGDAccountant` (models/privacy/dpsgd_accountant.py) starts in phase 1 at (q1, sigma1), gets
`begin_phase(q2, sigma2)` before the first critic update and exactly one `step()` per private update;
both phases' RDP add order by order and are converted once (add/remove-one adjacency: the adapters
convert to replace-one by group privacy).

Checkpoints every `checkpoint_every` steps (a step: one autoencoder update, or one GAN step) and at the
end of phase 1: the release file holds the decoder's and the latent model's weights with the epsilon so
far (SHA-256 sidecar, models/checkpoint_files.py); the training state (kept with its previous version)
restores every network, optimiser, random stream and the accountant, so a run interrupted in either
phase resumes from its newest intact state and ends bit for bit where an uninterrupted run would (the
replayed updates redraw the same secret batches and noise: nothing is queried twice with fresh
randomness).

Randomness. Poisson batches ("<name>-sampling"), noise ("<name>-noise") and the critic's fakes
("<name>-fakes", a key for `position_latents`) come from the run's `PrivacySecret`; initialisation and
the generator step's draws from the profile seed.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from dpsynth.models.checkpoint_files import resume_state, save_training_state, save_verified, write_text_atomic
from dpsynth.models.generators.dpsgd import SanitizedGradient, apply_gradient, clipped_sum, noisy_mean, poisson_batch
from dpsynth.models.generators.training_rows import TrainingRows
from dpsynth.models.generators.two_phase.config import TwoPhaseConfig
from dpsynth.models.privacy.secret import PrivacySecret

STATE_FILE = "training_state.pt"
LEDGER_FILE = "ledger.json"
ADJACENCY = "add/remove-one"
# What a training state restores by attribute name besides the networks a generator adds (`saved`).
SAVED = ("autoencoder", "generator", "critic", "opt_ae", "opt_critic", "opt_g")
STREAMS = ("rng", "sampling_rng", "noise_rng")


@dataclass
class UpdateInfo:
    """One private update (kept in memory only: the drawn batch size is not for publication)."""

    phase: str  # "autoencoder", "critic", or DP-auto-GAN's "gaussian" and "moments"
    real_rows: int


@dataclass
class TrainingResult:
    checkpoints: list[dict[str, Any]]
    seconds: float
    updates: list[UpdateInfo] = field(default_factory=list)


class TwoPhaseTrainer(ABC):
    """Both phases on encoded rows (values in [-1, 1]). A generator's trainer builds its networks
    (`autoencoder` with `.encoder` and `.decoder`, `generator`, `critic`) and optimisers (`opt_ae`,
    `opt_critic`, `opt_g`) and `spec` after this `__init__`, and gives the phase-specific pieces below.
    `run()` trains both phases, resuming from `checkpoint_dir` when a training state is there, and returns
    the ledger of released (decoder, latent model) checkpoints with their add/remove-one epsilons."""

    # The secret streams' prefix, and the networks a training state holds beyond `SAVED`.
    name: ClassVar[str]
    saved: ClassVar[tuple[str, ...]] = ()

    autoencoder: Any
    generator: nn.Module
    critic: nn.Module
    opt_ae: torch.optim.Optimizer
    opt_critic: torch.optim.Optimizer
    opt_g: torch.optim.Optimizer
    spec: Any

    def __init__(
        self,
        data: np.ndarray | torch.Tensor,
        config: TwoPhaseConfig,
        seed: int,
        secret: PrivacySecret,
        checkpoint_dir: str | Path,
        *,
        delta: float,
    ):
        self.config = config
        self.delta = float(delta)
        # Batches read from a memory map or an array (models/generators/training_rows.py).
        self.data = TrainingRows(data)
        n = int(self.data.shape[0])
        self.ae_rate, self.critic_rate = float(config.autoencoder_rate), float(config.critic_rate)
        # The sanitised sums' divisors: the expected batches q n (never a drawn batch's size).
        self.ae_divisor, self.critic_divisor = self.ae_rate * n, self.critic_rate * n
        self.dir = Path(checkpoint_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = torch.Generator().manual_seed(int(seed))
        self.sampling_rng = secret.torch(f"{self.name}-sampling")
        self.noise_rng = secret.torch(f"{self.name}-noise")
        self.fake_key = secret.seed(f"{self.name}-fakes")  # `position_latents`: the critic's fakes per row
        from dpsynth.models.privacy.dpsgd_accountant import DPSGDAccountant  # here: sampling needs no Opacus

        self.accountant = DPSGDAccountant(self.ae_rate, config.autoencoder_noise)
        self.step_index = 0  # autoencoder updates, then GAN steps
        self.ledger: list[dict[str, Any]] = []
        self.resume_notes: list[str] = []

    # -- what each generator gives -----------------------------------------------------------------
    @property
    def latent_phase(self) -> str:
        """Phase 2's name in the ledger."""
        return "gan"

    def released_latent(self) -> nn.Module:
        """What the release file holds under "generator"."""
        return self.generator

    @abstractmethod
    def autoencoder_gradients(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each row's gradient of its reconstruction loss over every autoencoder weight."""

    @abstractmethod
    def pair_gradients(self, update: int, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each sampled real row's (real, fake) pair gradient of the critic's loss in critic update
        `update` (`index`: the Poisson batch's row positions)."""

    def autoencoder_clipped_sum(self, rows: torch.Tensor, clip: float) -> dict[str, torch.Tensor]:
        """The sum of the rows' `autoencoder_gradients`, each clipped to `clip` (one joint norm). A generator
        whose networks allow it computes the same sum without per-row gradients (ghost_clipping.py)."""
        return clipped_sum(self.autoencoder_gradients(rows), clip)

    def pair_clipped_sum(self, update: int, index: torch.Tensor, clip: float) -> dict[str, torch.Tensor]:
        """The sum of the pairs' `pair_gradients`, each clipped to `clip` as one vector (as above)."""
        return clipped_sum(self.pair_gradients(update, index), clip)

    @abstractmethod
    def generator_fakes(self) -> torch.Tensor:
        """A generator step's fakes as the critic reads them (draws from the seed's stream only)."""

    def after_critic_update(self) -> None:  # noqa: B027 (a hook: most generators post-process nothing)
        """Post-processing of the private critic after each update (none by default)."""

    def after_generator_update(self) -> None:  # noqa: B027 (a hook, as above)
        """Post-processing of the generator after each step (none by default)."""

    def written_for_extra(self) -> dict[str, Any]:
        """Run values beyond the section a training state must have been written for."""
        return {}

    # -- phase 1 ---------------------------------------------------------------------------------
    @property
    def phase(self) -> str:
        return "autoencoder" if self.step_index < self.config.autoencoder_steps else self.latent_phase

    def autoencoder_update(self) -> tuple[int, SanitizedGradient]:
        """One private autoencoder update (encoder and decoder clipped and noised together)."""
        cfg = self.config
        index = poisson_batch(self.data.shape[0], self.ae_rate, self.sampling_rng)
        summed = self.autoencoder_clipped_sum(self.data[index], cfg.autoencoder_clip)
        parts = noisy_mean(summed, cfg.autoencoder_clip, cfg.autoencoder_noise, self.ae_divisor, self.noise_rng)
        apply_gradient(self.autoencoder, parts.total, self.opt_ae)
        return int(index.numel()), parts

    # -- phase 2 ---------------------------------------------------------------------------------
    def critic_update(self, update: int) -> tuple[int, SanitizedGradient]:
        """Private critic update number `update`: each real row of a Poisson batch paired with the fake of
        its own row position (`position_latents`, so whether one row is sampled changes no other pair and
        advances no stream), each pair's gradient clipped as one vector, one noise draw on the sum."""
        cfg = self.config
        index = poisson_batch(self.data.shape[0], self.critic_rate, self.sampling_rng)
        summed = self.pair_clipped_sum(update, index, cfg.critic_clip)
        parts = noisy_mean(summed, cfg.critic_clip, cfg.critic_noise, self.critic_divisor, self.noise_rng)
        apply_gradient(self.critic, parts.total, self.opt_critic)
        self.after_critic_update()
        return int(index.numel()), parts

    def generator_update(self) -> float:
        """One ordinary generator step: reads only the (private) critic and the frozen decoder."""
        loss = -self.critic(self.generator_fakes()).mean()
        grads = torch.autograd.grad(loss, list(self.generator.parameters()))
        for p, g in zip(self.generator.parameters(), grads, strict=True):
            p.grad = g
        self.opt_g.step()
        self.after_generator_update()
        return float(loss.detach())

    def latent_step(self) -> list[UpdateInfo]:
        """One GAN step: `critic_steps` private critic updates (the accountant's phase 2 begins before
        the first), then a generator update."""
        cfg = self.config
        if self.step_index == cfg.autoencoder_steps:
            self.accountant.begin_phase(self.critic_rate, cfg.critic_noise)
        first = (self.step_index - cfg.autoencoder_steps) * cfg.critic_steps
        done = []
        for j in range(cfg.critic_steps):
            rows, _ = self.critic_update(first + j)
            self.accountant.step()
            done.append(UpdateInfo("critic", rows))
        self.generator_update()
        return done

    # -- one step of either phase ------------------------------------------------------------------
    def step(self) -> list[UpdateInfo]:
        """Phase 1: one private autoencoder update; phase 2: `latent_step`. Exactly one accountant step
        per private query."""
        if self.phase == "autoencoder":
            rows, _ = self.autoencoder_update()
            self.accountant.step()
            done = [UpdateInfo("autoencoder", rows)]
        else:
            done = self.latent_step()
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
                "generator": self.released_latent().state_dict(),
                "step": step,
                "epsilon": eps,
                "delta": self.delta,
                "adjacency": ADJACENCY,
            },
            release,
        )
        phase = "autoencoder" if step <= self.config.autoencoder_steps else self.latent_phase
        self.ledger = [e for e in self.ledger if e["step"] < step] + [
            {"step": step, "phase": phase, "epsilon": eps, "release": release.name, "sha256": digest}
        ]
        state: dict[str, Any] = {"step": step, **self._written_for(), "ledger": self.ledger}
        state.update({name: getattr(self, name).state_dict() for name in SAVED + self.saved})
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
        return {
            "config": self.config.model_dump(),
            "delta": self.delta,
            **self.written_for_extra(),
            "rows": int(self.data.shape[0]),
        }

    def _load_state(self) -> bool:
        """Resume from the newest intact training state (the latest, else the one before it)."""
        state, self.resume_notes = resume_state(self.dir / STATE_FILE, "step", written_for=self._written_for())
        if state is None:
            return False
        self.step_index = state["step"]
        for name in SAVED + self.saved:
            getattr(self, name).load_state_dict(state[name])
        for name in STREAMS:
            getattr(self, name).set_state(state[name])
        # The saved history may already be in phase 2: rebuild rather than load into a phase-1 accountant.
        self.accountant = type(self.accountant).from_state_dict(state["accountant"])
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
