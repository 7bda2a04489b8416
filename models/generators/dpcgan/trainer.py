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

* `ConditionalGenerator`: [z, one-hot label] -> Linear / LayerNorm / ReLU layers -> logits -> the same
  output heads as GS-WGAN (models/generators/networks.py `OutputHead`: "typed" or "gumbel" keep each one-hot group
  a valid distribution), then the label is copied into the binary target's encoded column (+1 for
  label 1, -1 for label 0), so every row carries exactly the label it was asked for.
* `ConditionalDiscriminator`: [row, one-hot label] -> Linear / LayerNorm / LeakyReLU(0.2) -> one logit.
  No BatchNorm: BatchNorm mixes the rows of a batch, so one row's gradient would touch the others' and
  per-example clipping would no longer bound a row's influence. It passes Opacus's ModuleValidator.
* `sanitized_gradient`: per-example gradients (torch.func: vmap of grad over rows), each real and
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

Adjacency caveat, for the wiring to come. Opacus's RDP analysis of the sampled Gaussian mechanism
(models/privacy/dpsgd_accountant.py) holds under add/remove-one adjacency. dpsynth's unit of privacy elsewhere
(GS-WGAN's accountant, the release statement) is replace-one. Replacing a row is a removal then an
addition, so an add/remove (epsilon, delta) gives replace-one only through group privacy of size two,
(2 epsilon, (1 + e^epsilon) delta), or through a separate replace-one analysis of the Poisson-subsampled
Gaussian (sensitivity 2C). `dpsynth.models.privacy.dpsgd_accountant.replace_one_epsilon` gives the first; this module
records the add/remove-one epsilon (ledger, checkpoints: "adjacency": "add/remove-one"), which must not be
reported as replace-one as it is, nor its RDP curve added to a replace-one curve (models/privacy/lifetime.py).

Not done yet (issue 17 step 1 and later): no wiring into flows/ or tasks/, no registration behind the
generator interface, no profile section (`DPCGANConfig` is built directly), no budget stop (training
runs the iterations it is given; the caller must choose them so that epsilon stays within budget).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from dpsynth.models.checkpoint_files import (
    load_verified,
    resume_state,
    save_training_state,
    save_verified,
    write_text_atomic,
)
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.gswgan.sanitizer import finite_rows
from dpsynth.models.generators.networks import LEAKY_SLOPE, OutputHead, head_noise_width, init_generator_
from dpsynth.models.privacy.secret import PrivacySecret

STATE_FILE = "training_state.pt"
LEDGER_FILE = "ledger.json"
HEADS = ("tanh", "typed", "gumbel")
LABELS = 2  # binary target: label 0 (encoded -1) and label 1 (encoded +1)
# Added to a per-example norm before dividing by it (Opacus adds the same): no division by zero.
_NORM_EPS = 1e-6


# ---------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------

def one_hot_labels(labels: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    # A comparison, not F.one_hot: one_hot checks its input's range, which vmap cannot trace.
    return (labels.long().unsqueeze(-1) == torch.arange(LABELS, device=labels.device)).to(dtype)


def _check_groups(groups, out_width: int, target_index: int) -> list[tuple[int, int, str]]:
    """The encoder's (start, stop, kind) blocks; the target must be one of them, binary."""
    checked = [(int(g[0]), int(g[1]), str(g[2])) for g in groups]
    if not any(g == (target_index, target_index + 1, "binary") for g in checked):
        raise ConfigError(f"encoded column {target_index} is not a binary block of the encoding: DP-CGAN "
                          "conditions on a binary target column")
    if checked and max(g[1] for g in checked) > out_width:
        raise ConfigError(f"the encoding's blocks reach past the encoded width {out_width}")
    return checked


class ConditionalGenerator(nn.Module):
    """[z, one-hot label] -> hidden layers -> an encoded row, the label written into the target column.

    The "gumbel" head also reads one Uniform(0, 1) per encoded column (`head_noise`)."""

    def __init__(self, z_dim: int, hidden: tuple[int, ...], out_width: int, head: str,
                 groups, target_index: int):
        super().__init__()
        if head not in HEADS:
            raise ConfigError(f"the output head must be one of {', '.join(HEADS)}, got {head!r}")
        self.z_dim, self.out_width, self.target_index = z_dim, out_width, int(target_index)
        self.noise_width = head_noise_width(head, out_width)
        layers, width = [], z_dim + LABELS
        for h in hidden:
            # LayerNorm, not BatchNorm: a row's output then does not depend on the batch it is sampled
            # in, and training and sampling compute the same function.
            layers += [nn.Linear(width, h), nn.LayerNorm(h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, out_width))
        self.body = nn.Sequential(*layers)
        self.head = OutputHead(head, _check_groups(groups, out_width, target_index))

    def forward(self, z: torch.Tensor, labels: torch.Tensor, head_noise: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.body(torch.cat([z, one_hot_labels(labels, z.dtype)], -1))
        out = self.head(logits, head_noise)
        # The label is an input, not generated: copied in, so no gradient reaches the target's logit.
        column = torch.zeros(out.shape[-1], dtype=torch.bool, device=out.device)
        column[self.target_index] = True
        return torch.where(column, (2.0 * labels.to(out.dtype) - 1.0).unsqueeze(-1), out)

    def draw_inputs(self, n_rows: int, labels: torch.Tensor, rng: torch.Generator):
        """(z, head noise or None) for n_rows rows, drawn from `rng` in that order."""
        z = torch.randn(n_rows, self.z_dim, generator=rng)
        noise = torch.rand(n_rows, self.noise_width, generator=rng) if self.noise_width else None
        return z, noise


class ConditionalDiscriminator(nn.Module):
    """[row, one-hot label] -> hidden layers (LayerNorm, LeakyReLU 0.2) -> one logit per row."""

    def __init__(self, in_width: int, hidden: tuple[int, ...]):
        super().__init__()
        layers, width = [], in_width + LABELS
        for h in hidden:
            layers += [nn.Linear(width, h), nn.LayerNorm(h), nn.LeakyReLU(LEAKY_SLOPE)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.body = nn.Sequential(*layers)

    def forward(self, rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.body(torch.cat([rows, one_hot_labels(labels, rows.dtype)], -1)).squeeze(-1)


# ---------------------------------------------------------------------------------------------------
# The sanitised discriminator gradient
# ---------------------------------------------------------------------------------------------------

def per_sample_gradients(disc: ConditionalDiscriminator, rows: torch.Tensor, labels: torch.Tensor,
                         real: bool) -> dict[str, torch.Tensor]:
    """Each row's gradient of its own loss (real: -log D; fake: -log(1 - D)), per parameter name,
    shape [rows, *parameter shape]. LayerNorm works on one row at a time, so one row's gradient does
    not depend on the other rows of the batch."""
    params = {k: v.detach() for k, v in disc.named_parameters()}
    if rows.shape[0] == 0:
        return {k: v.new_zeros((0, *v.shape)) for k, v in params.items()}
    target = torch.tensor(1.0 if real else 0.0, dtype=rows.dtype, device=rows.device)

    def loss_one(p, row, label):
        logit = functional_call(disc, p, (row.unsqueeze(0), label.unsqueeze(0)))
        return F.binary_cross_entropy_with_logits(logit.squeeze(0), target)

    return vmap(grad(loss_one), in_dims=(None, 0, 0))(params, rows, labels)


def clipped_sum(per_sample: dict[str, torch.Tensor], clip: float) -> dict[str, torch.Tensor]:
    """Sum over rows of each row's gradient scaled to L2 norm at most `clip` (norm over all parameters
    together, as DP-SGD's sensitivity needs). A row whose gradient holds a NaN or an infinity in any
    parameter contributes zero (its norm would not bound it: `dpsynth.models.generators.gswgan.sanitizer.zero_nonfinite_rows`)."""
    flat = torch.cat([g.flatten(1) for g in per_sample.values()], 1)  # also for an empty Poisson batch (0 rows)
    finite = finite_rows(flat)
    norms = torch.where(finite[:, None], flat, 0.0).norm(dim=1)
    factors = torch.where(finite, (clip / (norms + _NORM_EPS)).clamp(max=1.0), 0.0)
    return {k: torch.einsum("n,n...->...", factors, torch.where(_rows_mask(finite, g), g, 0.0))
            for k, g in per_sample.items()}


def _rows_mask(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return rows.reshape((-1,) + (1,) * (like.dim() - 1))


@dataclass
class SanitizedGradient:
    """The parts of one discriminator update's gradient, per parameter name. `total` is what the
    optimiser applies: (real_sum + noise + fake_sum) / expected_batch."""

    real_sum: dict[str, torch.Tensor]
    noise: dict[str, torch.Tensor]
    fake_sum: dict[str, torch.Tensor]
    total: dict[str, torch.Tensor]


def sanitized_gradient(disc: ConditionalDiscriminator, real: torch.Tensor, real_labels: torch.Tensor,
                       fake: torch.Tensor, fake_labels: torch.Tensor, clip: float, noise_multiplier: float,
                       expected_batch: float, noise_rng: torch.Generator | None) -> SanitizedGradient:
    """The discriminator's gradient: real and fake per-example gradients clipped separately to `clip`,
    Gaussian noise of standard deviation noise_multiplier * clip on the real sum only (drawn from
    `noise_rng`, in the order of `disc.named_parameters()`), all divided by `expected_batch`."""
    real_sum = clipped_sum(per_sample_gradients(disc, real, real_labels, real=True), clip)
    fake_sum = clipped_sum(per_sample_gradients(disc, fake.detach(), fake_labels, real=False), clip)
    std = noise_multiplier * clip
    noise = {}
    for k, g in real_sum.items():
        if std > 0:
            noise[k] = torch.randn(g.shape, generator=noise_rng, dtype=g.dtype, device=g.device).mul_(std)
        else:
            noise[k] = torch.zeros_like(g)
    total = {k: (real_sum[k] + noise[k] + fake_sum[k]) / expected_batch for k in real_sum}
    return SanitizedGradient(real_sum, noise, fake_sum, total)


# ---------------------------------------------------------------------------------------------------
# Configuration and generator spec
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DPCGANConfig:
    """Hyperparameters of one DP-CGAN run. Defaults follow the paper's Thyroid run where it gives them
    (B = 32, sigma = 1.15, C = 1.1, SGD for D, Adam for G, one hidden layer of 128)."""

    expected_batch: int = 32
    clip: float = 1.1
    noise_multiplier: float = 1.15
    iterations: int = 1000
    checkpoint_every: int = 100
    z_dim: int = 32
    generator_hidden: tuple[int, ...] = (128,)
    discriminator_hidden: tuple[int, ...] = (128,)
    head: str = "typed"
    discriminator_optimizer: str = "sgd"  # the paper's; "adam" is post-processing of the same gradients
    lr_discriminator: float = 0.05
    lr_generator: float = 2e-4
    betas: tuple[float, float] = (0.5, 0.999)
    label_prior: float = 0.5  # public share of label 1 among fake rows (the paper's prior p_l)
    delta: float = 1e-5
    # A fixed, public sampling rate q; null derives it from the batch (q = expected_batch / n, as the
    # paper). Given, the accountant's inputs are all public (q = B / n would tie epsilon to the row
    # count), the divisor is q n and each fake batch has round(q n) rows; expected_batch is unused.
    sample_rate: float | None = None

    def __post_init__(self) -> None:
        for name in ("expected_batch", "iterations", "checkpoint_every", "z_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"dpcgan.{name} must be an integer >= 1, got {value!r}")
        for name in ("clip", "noise_multiplier", "lr_discriminator", "lr_generator"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"dpcgan.{name} must be a finite number > 0, got {value!r}")
        if not 0 < self.label_prior < 1:
            raise ConfigError(f"dpcgan.label_prior must be in (0, 1), got {self.label_prior!r}")
        if not 0 < self.delta < 1:
            raise ConfigError(f"dpcgan.delta must be in (0, 1), got {self.delta!r}")
        if self.sample_rate is not None and not 0 < self.sample_rate <= 1:
            raise ConfigError(f"dpcgan.sample_rate must be in (0, 1], got {self.sample_rate!r}")
        if self.head not in HEADS:
            raise ConfigError(f"dpcgan.head must be one of {', '.join(HEADS)}, got {self.head!r}")
        if self.discriminator_optimizer not in ("sgd", "adam"):
            raise ConfigError(f"dpcgan.discriminator_optimizer must be sgd or adam, got {self.discriminator_optimizer!r}")
        object.__setattr__(self, "generator_hidden", tuple(self.generator_hidden))
        object.__setattr__(self, "discriminator_hidden", tuple(self.discriminator_hidden))
        object.__setattr__(self, "betas", tuple(self.betas))

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


@dataclass(frozen=True)
class CGANGeneratorSpec:
    """Everything needed to rebuild the generator for sampling, stored beside its weights."""

    z_dim: int
    hidden: tuple[int, ...]
    out_width: int
    head: str
    groups: tuple[tuple[int, int, str], ...]
    target_index: int
    label_prior: float

    def build(self) -> ConditionalGenerator:
        return ConditionalGenerator(self.z_dim, self.hidden, self.out_width, self.head, self.groups,
                                    self.target_index)

    def to_dict(self) -> dict:
        return {"z_dim": self.z_dim, "hidden": list(self.hidden), "out_width": self.out_width, "head": self.head,
                "groups": [list(g) for g in self.groups], "target_index": self.target_index,
                "label_prior": self.label_prior}

    @classmethod
    def from_dict(cls, d: dict) -> CGANGeneratorSpec:
        return cls(int(d["z_dim"]), tuple(d["hidden"]), int(d["out_width"]), d["head"],
                   tuple((int(g[0]), int(g[1]), str(g[2])) for g in d["groups"]), int(d["target_index"]),
                   float(d["label_prior"]))


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


def _labels_of(data: torch.Tensor, target_index: int) -> torch.Tensor:
    column = data[:, target_index]
    if not bool(((column == 1.0) | (column == -1.0)).all()):
        raise ConfigError(f"encoded column {target_index} is not a binary target: its values must be -1 or +1")
    return (column > 0).long()


class DPCGANTrainer:
    """DP-CGAN on encoded rows (values in [-1, 1]) with a binary target at `target_index`.

    `run(last_iteration)` trains (resuming from `checkpoint_dir/training_state.pt` when present) and
    returns the ledger of generator checkpoints with their epsilons (add/remove-one; module notes)."""

    def __init__(self, data: torch.Tensor, target_index: int, groups, config: DPCGANConfig, seed: int,
                 secret: PrivacySecret, checkpoint_dir: str | Path):
        self.config = config
        self.data = torch.as_tensor(data, dtype=torch.float32)
        n, width = self.data.shape
        if config.sample_rate is None and config.expected_batch > n:
            raise ConfigError(f"dpcgan.expected_batch ({config.expected_batch}) exceeds the {n} training rows")
        self.labels = _labels_of(self.data, target_index)
        self.sample_rate = config.expected_batch / n if config.sample_rate is None else float(config.sample_rate)
        # The sanitised sum's divisor: the expected batch q n (never the drawn batch's size).
        self.expected_batch = config.expected_batch if config.sample_rate is None else self.sample_rate * n
        self.fake_rows = max(1, round(self.expected_batch))
        self.spec = CGANGeneratorSpec(config.z_dim, config.generator_hidden, width, config.head,
                                      tuple(_check_groups(groups, width, target_index)), int(target_index),
                                      config.label_prior)
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
        if config.discriminator_optimizer == "sgd":
            self.opt_d = torch.optim.SGD(self.discriminator.parameters(), lr=config.lr_discriminator)
        else:
            self.opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=config.lr_discriminator,
                                          betas=config.betas)
        from dpsynth.models.privacy.dpsgd_accountant import DPSGDAccountant  # here: sampling needs no Opacus

        self.accountant = DPSGDAccountant(self.sample_rate, config.noise_multiplier)
        self.iteration = 0
        self.ledger: list[dict] = []
        self.resume_notes: list[str] = []

    # -- one update ------------------------------------------------------------------------------
    def draw_real_batch(self) -> torch.Tensor:
        """Poisson sampling from the secret: each row enters independently with probability q."""
        mask = torch.rand(self.data.shape[0], generator=self.sampling_rng) < self.sample_rate
        return mask.nonzero().squeeze(1)

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
        parts = sanitized_gradient(self.discriminator, self.data[index], self.labels[index], fake, fake_labels,
                                   cfg.clip, cfg.noise_multiplier, self.expected_batch, self.noise_rng)
        for name, p in self.discriminator.named_parameters():
            p.grad = parts.total[name]
        self.opt_d.step()
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
        return self.accountant.epsilon(self.config.delta, "classic")

    def _save_checkpoint(self) -> None:
        it = self.iteration
        eps = self.epsilon()
        gen_file = self.dir / f"generator_{it:06d}.pt"
        digest = save_verified({"spec": self.spec.to_dict(), "state_dict": self.generator.state_dict(),
                                "iteration": it, "epsilon": eps, "delta": self.config.delta,
                                "adjacency": "add/remove-one"}, gen_file)
        self.ledger = [e for e in self.ledger if e["iteration"] < it] + [
            {"iteration": it, "epsilon": eps, "generator": gen_file.name, "sha256": digest}]
        state = {
            "iteration": it,
            "config": self.config.to_dict(),
            "rows": int(self.data.shape[0]),
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
        write_text_atomic(json.dumps({"mechanism": self.accountant.mechanism, "adjacency": "add/remove-one",
                                       "checkpoints": self.ledger}, indent=1), self.dir / LEDGER_FILE)

    def _load_state(self) -> bool:
        """Resume from the newest intact training state (the latest, else the one before it)."""
        state, self.resume_notes = resume_state(
            self.dir / STATE_FILE, "iteration", written_for={"config": self.config.to_dict(), "rows": self.data.shape[0]})
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

    def run(self, last_iteration: int | None = None, stop_after: int | None = None,
            progress: Callable[[int, float], None] | None = None) -> TrainingResult:
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


# ---------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------

def load_generator(path: str | Path, sha256: str | None = None) -> tuple[ConditionalGenerator, dict]:
    """A generator checkpoint, checked against its SHA-256 (the ledger's, else its sidecar's)."""
    blob = load_verified(Path(path), sha256, map_location="cpu", weights_only=False)
    gen = CGANGeneratorSpec.from_dict(blob["spec"]).build()
    gen.load_state_dict(blob["state_dict"])
    gen.eval()
    return gen, blob


def sample_encoded(gen: ConditionalGenerator, n_rows: int, seed: int, label: int | None = None,
                   label_prior: float = 0.5, batch: int = 8192) -> np.ndarray:
    """n encoded rows: all with `label` (0 or 1), or labels drawn from the public `label_prior`."""
    if label not in (None, 0, 1):
        raise ConfigError(f"a DP-CGAN label is 0 or 1, got {label!r}")
    rng = torch.Generator().manual_seed(int(seed))
    parts = []
    with torch.no_grad():
        for start in range(0, n_rows, batch):
            size = min(batch, n_rows - start)
            if label is None:
                labels = (torch.rand(size, generator=rng) < label_prior).long()
            else:
                labels = torch.full((size,), int(label), dtype=torch.long)
            z, noise = gen.draw_inputs(size, labels, rng)
            parts.append(gen(z, labels, noise).numpy())
    if not parts:
        return np.zeros((0, gen.out_width), dtype=np.float32)
    return np.concatenate(parts)


__all__ = ["CGANGeneratorSpec", "ConditionalDiscriminator", "ConditionalGenerator", "DPCGANConfig",
           "DPCGANTrainer", "SanitizedGradient", "StepInfo", "TrainingResult", "clipped_sum", "load_generator",
           "per_sample_gradients", "sample_encoded", "sanitized_gradient"]
