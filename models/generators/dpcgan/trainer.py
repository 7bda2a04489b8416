"""DP-CGAN for tables (Torkzadehmahani, Kairouz and Paten 2019, reimplemented by Carvalho).

What the paper does. A conditional GAN: the generator reads z and the class label, the discriminator
reads a row and its label (both as a one-hot). Only the discriminator reads the data, so only its
training is private: each update draws a batch of real rows with probability B/N each, computes the
per-example gradients of the real loss -log D(x, y) and of the fake loss -log(1 - D(G(z, l), l)),
clips the real and the fake gradients *separately* to norm C, adds Gaussian noise N(0, sigma^2 C^2)
and averages (Algorithm 1 with m = B microbatches, the setting the paper found best). The generator's
update reads only the discriminator's output on generated rows: it is post-processing of the private
discriminator and needs no noise. The fake labels come from a public prior (the paper's p_l), not from
the real batch, so the fake part reads no data either. Epsilon comes from the RDP accountant of the
Poisson-subsampled Gaussian mechanism, one composition per discriminator update.

What this module implements.

* `ConditionalGenerator` (networks.py): [z, one-hot label] -> Linear / LayerNorm / ReLU layers -> logits -> the same
  output heads as GS-WGAN (models/generators/networks.py `OutputHead`: "typed" or "gumbel" keep each one-hot group
  a valid distribution), then the label is copied into the binary target's encoded column (+1 for
  label 1, -1 for label 0), so every row carries exactly the label it was asked for.
* `ConditionalDiscriminator` (networks.py): [row, one-hot label] -> Linear / LayerNorm / LeakyReLU(0.2) -> one logit.
  No BatchNorm: BatchNorm mixes the rows of a batch, so one row's gradient would touch the others' and
  per-example clipping would no longer bound a row's influence. It passes Opacus's ModuleValidator.
* `sanitized_gradient`: per-example gradients (torch.func: vmap of grad over rows; the DP-SGD pieces
  are models/generators/dpsgd.py's), each real and
  each fake gradient clipped to C on its own, the real ones summed plus ONE draw of N(0, sigma^2 C^2 I)
  from the secret, the fake ones summed without noise, and (real sum + noise + fake sum) divided by
  the EXPECTED batch size B = q n (a fixed, public number: dividing by the drawn batch size would
  leak it, and the sensitivity argument needs the divisor to be data-independent). The fake batch has
  exactly B rows. Noising only the real sum is the paper's point (and TF Privacy's: one noise draw per
  sanitised sum, not one per microbatch as Algorithm 1's notation suggests).
* `DPCGANTrainer`: one discriminator update (Poisson batch drawn from the secret's "dpcgan-sampling"
  stream: each row independently with probability q; noise from "dpcgan-noise"), then one ordinary
  generator step (non-saturating loss -log D(G(z, l), l), the usual form of the paper's
  log(1 - D(G))), then exactly one `DPSGDAccountant.step()`. An update whose Poisson batch is empty
  still adds noise, steps and is counted: that is the mechanism the accountant analyses. Checkpoints
  every `checkpoint_every` updates: the generator's weights with the epsilon at that point (SHA-256
  sidecar, models/checkpoint_files.py), and the whole training state (kept with its previous version)
  from which `run` resumes exactly. A resumed run replays the updates after its last checkpoint with
  the same secret streams, so it releases exactly what the uninterrupted run would have: nothing is
  queried twice with fresh randomness.

Randomness. The Poisson batches and the noise come from the run's `PrivacySecret` (models/privacy/secret.py);
initialisation, latents, fake labels and the gumbel head's noise from the profile seed. All generator
states are checkpointed, so a run is a function of (seed, secret, data, config).

Adjacency. Opacus's RDP analysis of the sampled Gaussian mechanism
(models/privacy/dpsgd_accountant.py) holds under add/remove-one adjacency. dpsynth's unit of privacy elsewhere
(GS-WGAN's accountant, the release statement) is replace-one. Replacing a row is a removal then an
addition, so an add/remove (epsilon, delta) gives replace-one only through group privacy of size two,
(2 epsilon, (1 + e^epsilon) delta), or through a separate replace-one analysis of the Poisson-subsampled
Gaussian (sensitivity 2C). `dpsynth.models.privacy.dpsgd_accountant.replace_one_epsilon` gives the first; this module
records the add/remove-one epsilon (ledger, checkpoints: "adjacency": "add/remove-one"), which must not be
reported as replace-one as it is, nor its RDP curve added to a replace-one curve (models/privacy/lifetime.py);
the adapter (adapter.py) converts it.

Configuration. The trainer reads the profile's `dpcgan` section (config.py) as it is, and delta, a
value of the run, as an argument. Training runs the iterations it is given: the adapter's plan stops
it within the budget.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.func import functional_call
from torch.nn import functional as F

from dpsynth.models.checkpoint_files import (
    resume_state,
    save_training_state,
    save_verified,
    write_text_atomic,
)
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.dpcgan.config import DPCGANConfig
from dpsynth.models.generators.dpcgan.networks import (
    CGANGeneratorSpec,
    ConditionalDiscriminator,
    check_groups,
)
from dpsynth.models.generators.dpsgd import (
    apply_gradient,
    gaussian_noise,
    per_example_gradients,
    poisson_batch,
)
from dpsynth.models.generators.ghost_clipping import discriminator_clipped_sum
from dpsynth.models.generators.networks import init_generator_
from dpsynth.models.generators.training_rows import TrainingRows
from dpsynth.models.privacy.secret import PrivacySecret

STATE_FILE = "training_state.pt"
LEDGER_FILE = "ledger.json"


# ---------------------------------------------------------------------------------------------------
# The sanitised discriminator gradient
# ---------------------------------------------------------------------------------------------------


def per_sample_gradients(
    disc: ConditionalDiscriminator, rows: torch.Tensor, labels: torch.Tensor, real: bool
) -> dict[str, torch.Tensor]:
    """Each row's gradient of its own loss (real: -log D; fake: -log(1 - D)), per parameter name,
    shape [rows, *parameter shape]. LayerNorm works on one row at a time, so one row's gradient does
    not depend on the other rows of the batch."""
    target = torch.tensor(1.0 if real else 0.0, dtype=rows.dtype, device=rows.device)

    def loss_one(p, row, label):
        logit = functional_call(disc, p, (row.unsqueeze(0), label.unsqueeze(0)))
        return F.binary_cross_entropy_with_logits(logit.squeeze(0), target)

    return per_example_gradients(disc, loss_one, rows, labels)


@dataclass
class SanitizedGradient:
    """The parts of one discriminator update's gradient, per parameter name. `total` is what the
    optimiser applies: (real_sum + noise + fake_sum) / expected_batch."""

    real_sum: dict[str, torch.Tensor]
    noise: dict[str, torch.Tensor]
    fake_sum: dict[str, torch.Tensor]
    total: dict[str, torch.Tensor]


def sanitized_gradient(
    disc: ConditionalDiscriminator,
    real: torch.Tensor,
    real_labels: torch.Tensor,
    fake: torch.Tensor,
    fake_labels: torch.Tensor,
    clip: float,
    noise_multiplier: float,
    expected_batch: float,
    noise_rng: torch.Generator | None,
) -> SanitizedGradient:
    """The discriminator's gradient: real and fake per-example gradients clipped separately to `clip`,
    Gaussian noise of standard deviation noise_multiplier * clip on the real sum only (drawn from
    `noise_rng`, in the order of `disc.named_parameters()`), all divided by `expected_batch`."""
    # Each row's gradient (per_sample_gradients) clipped and summed without forming it: ghost_clipping.py.
    real_sum = discriminator_clipped_sum(disc, real, real_labels, True, clip)
    fake_sum = discriminator_clipped_sum(disc, fake.detach(), fake_labels, False, clip)
    noise = gaussian_noise(real_sum, noise_multiplier * clip, noise_rng)
    total = {k: (real_sum[k] + noise[k] + fake_sum[k]) / expected_batch for k in real_sum}
    return SanitizedGradient(real_sum, noise, fake_sum, total)


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------


@dataclass
class StepInfo:
    """What one update did (kept in memory only: the drawn batch size is not for publication)."""

    real_rows: int
    generator_loss: float


@dataclass
class TrainingResult:
    checkpoints: list[dict]
    seconds: float
    steps: list[StepInfo] = field(default_factory=list)


# Rows whose target column is read at once when the labels are made.
LABEL_CHUNK_ROWS = 65_536


def _labels_of(data: TrainingRows, target_index: int) -> torch.Tensor:
    """Each row's label (True: the positive level), read a chunk of rows at a time: one byte a row."""
    labels = []
    for part in data.columns([target_index]).chunks(LABEL_CHUNK_ROWS):
        column = part[:, 0]
        if not bool(((column == 1.0) | (column == -1.0)).all()):
            raise ConfigError(f"encoded column {target_index} is not a binary target: its values must be -1 or +1")
        labels.append(column > 0)
    return torch.cat(labels) if labels else torch.zeros(0, dtype=torch.bool)


class DPCGANTrainer:
    """DP-CGAN on encoded rows (values in [-1, 1]) with a binary target at `target_index`.

    `run(last_iteration)` trains (resuming from `checkpoint_dir/training_state.pt` when present) and
    returns the ledger of generator checkpoints with their epsilons (add/remove-one; module notes)."""

    def __init__(
        self,
        data: np.ndarray | torch.Tensor,
        target_index: int,
        groups,
        config: DPCGANConfig,
        seed: int,
        secret: PrivacySecret,
        checkpoint_dir: str | Path,
        *,
        delta: float,
    ):
        self.config, self.delta = config, float(delta)
        # Batches read from a memory map or an array (models/generators/training_rows.py).
        self.data = TrainingRows(data)
        n, width = self.data.shape
        self.labels = _labels_of(self.data, target_index)
        self.sample_rate = float(config.sample_rate)
        # The sanitised sum's divisor: the expected batch q n (never the drawn batch's size).
        self.expected_batch = self.sample_rate * n
        self.fake_rows = max(1, round(self.expected_batch))
        self.spec = CGANGeneratorSpec(
            config.z_dim,
            config.generator_hidden,
            width,
            config.head,
            tuple(check_groups(groups, width, target_index)),
            int(target_index),
            config.label_prior,
        )
        self.dir = Path(checkpoint_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = torch.Generator().manual_seed(int(seed))
        self.generator = self.spec.build()
        self.discriminator = ConditionalDiscriminator(width, config.discriminator_hidden)
        # PyTorch's default scaled-uniform initialisation, but drawn from the seed's stream (not the
        # process-wide generator), so the seed alone fixes it.
        init_generator_(self.generator, "default", self.rng)
        init_generator_(self.discriminator, "default", self.rng)
        self.sampling_rng = secret.torch("dpcgan-sampling")
        self.noise_rng = secret.torch("dpcgan-noise")
        self.opt_g = torch.optim.Adam(self.generator.parameters(), lr=config.lr_generator, betas=config.betas)
        self.opt_d: torch.optim.Optimizer
        if config.discriminator_optimizer == "sgd":
            self.opt_d = torch.optim.SGD(self.discriminator.parameters(), lr=config.lr_discriminator)
        else:
            self.opt_d = torch.optim.Adam(
                self.discriminator.parameters(), lr=config.lr_discriminator, betas=config.betas
            )
        from dpsynth.models.privacy.dpsgd_accountant import DPSGDAccountant  # here: sampling needs no Opacus

        self.accountant = DPSGDAccountant(self.sample_rate, config.noise_multiplier)
        self.iteration = 0
        self.ledger: list[dict] = []
        self.resume_notes: list[str] = []

    # -- one update ------------------------------------------------------------------------------
    def draw_real_batch(self) -> torch.Tensor:
        """Poisson sampling from the secret: each row enters independently with probability q."""
        return poisson_batch(self.data.shape[0], self.sample_rate, self.sampling_rng)

    def draw_fake(self, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n_rows generated rows and their labels (from the public prior), drawn from the seed's stream."""
        labels = (torch.rand(n_rows, generator=self.rng) < self.config.label_prior).long()
        z, noise = self.generator.draw_inputs(n_rows, labels, self.rng)
        return self.generator(z, labels, noise), labels

    def discriminator_step(self) -> tuple[int, SanitizedGradient]:
        """One private discriminator update; returns the real batch size and the gradient's parts."""
        cfg = self.config
        index = self.draw_real_batch()
        with torch.no_grad():
            fake, fake_labels = self.draw_fake(self.fake_rows)
        parts = sanitized_gradient(
            self.discriminator,
            self.data[index],
            self.labels[index].long(),
            fake,
            fake_labels,
            cfg.clip,
            cfg.noise_multiplier,
            self.expected_batch,
            self.noise_rng,
        )
        apply_gradient(self.discriminator, parts.total, self.opt_d)
        return int(index.numel()), parts

    def generator_step(self) -> float:
        """One ordinary generator step (post-processing: it reads only D's output on generated rows)."""
        fake, labels = self.draw_fake(self.fake_rows)
        logits = self.discriminator(fake, labels)
        loss = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))
        self.opt_g.zero_grad(set_to_none=True)
        self.discriminator.zero_grad(set_to_none=True)
        loss.backward()
        self.opt_g.step()
        self.discriminator.zero_grad(set_to_none=True)  # D's gradient here is not a sanitised one
        return float(loss.detach())

    def step(self) -> StepInfo:
        """One iteration: a sanitised discriminator update (one accounted query), then a generator step."""
        rows, _ = self.discriminator_step()
        self.accountant.step()
        g_loss = self.generator_step()
        self.iteration += 1
        return StepInfo(rows, g_loss)

    # -- checkpoints -----------------------------------------------------------------------------
    def epsilon(self) -> float:
        """Epsilon (add/remove-one, classic conversion) of the updates so far at the configured delta."""
        return self.accountant.epsilon(self.delta, "classic")

    def _save_checkpoint(self) -> None:
        it = self.iteration
        eps = self.epsilon()
        gen_file = self.dir / f"generator_{it:06d}.pt"
        digest = save_verified(
            {
                "spec": self.spec.to_dict(),
                "state_dict": self.generator.state_dict(),
                "iteration": it,
                "epsilon": eps,
                "delta": self.delta,
                "adjacency": "add/remove-one",
            },
            gen_file,
        )
        self.ledger = [e for e in self.ledger if e["iteration"] < it] + [
            {"iteration": it, "epsilon": eps, "generator": gen_file.name, "sha256": digest}
        ]
        state = {
            "iteration": it,
            **self._written_for(),
            "generator": self.generator.state_dict(),
            "discriminator": self.discriminator.state_dict(),
            "opt_g": self.opt_g.state_dict(),
            "opt_d": self.opt_d.state_dict(),
            "accountant": self.accountant.state_dict(),
            "rng": self.rng.get_state(),
            "sampling_rng": self.sampling_rng.get_state(),
            "noise_rng": self.noise_rng.get_state(),
            "ledger": self.ledger,
        }
        save_training_state(state, self.dir / STATE_FILE)
        write_text_atomic(
            json.dumps(
                {"mechanism": self.accountant.mechanism, "adjacency": "add/remove-one", "checkpoints": self.ledger},
                indent=1,
            ),
            self.dir / LEDGER_FILE,
        )

    def _written_for(self) -> dict:
        """What a training state must have been written for to be resumed here."""
        return {"config": self.config.model_dump(), "delta": self.delta, "rows": int(self.data.shape[0])}

    def _load_state(self) -> bool:
        """Resume from the newest intact training state (the latest, else the one before it)."""
        state, self.resume_notes = resume_state(
            self.dir / STATE_FILE, "iteration", written_for={**self._written_for(), "rows": self.data.shape[0]}
        )
        if state is None:
            return False
        self.iteration = state["iteration"]
        self.generator.load_state_dict(state["generator"])
        self.discriminator.load_state_dict(state["discriminator"])
        self.opt_g.load_state_dict(state["opt_g"])
        self.opt_d.load_state_dict(state["opt_d"])
        self.accountant.load_state_dict(state["accountant"])
        self.rng.set_state(state["rng"])
        self.sampling_rng.set_state(state["sampling_rng"])
        self.noise_rng.set_state(state["noise_rng"])
        self.ledger = state["ledger"]
        return True

    def run(
        self,
        last_iteration: int | None = None,
        stop_after: int | None = None,
        progress: Callable[[int, float], None] | None = None,
    ) -> TrainingResult:
        """Train to `last_iteration` (default: config.iterations), checkpointing every `checkpoint_every`
        updates. `stop_after` ends the call after that many updates (simulates an interruption).
        `progress(iteration, epsilon)` is called at every checkpoint."""
        start = time.perf_counter()
        last = self.config.iterations if last_iteration is None else int(last_iteration)
        if not self._load_state():
            self._save_checkpoint()  # iteration 0: the untrained generator costs no privacy
        steps: list[StepInfo] = []
        while self.iteration < last and (stop_after is None or len(steps) < stop_after):
            steps.append(self.step())
            if self.iteration % self.config.checkpoint_every == 0:
                self._save_checkpoint()
                if progress is not None:
                    progress(self.iteration, self.ledger[-1]["epsilon"])
        return TrainingResult(list(self.ledger), time.perf_counter() - start, steps)
