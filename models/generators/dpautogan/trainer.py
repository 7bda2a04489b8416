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

What this module implements, and where it differs.

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

Adjacency caveat, for the wiring to come. Opacus's RDP analysis of the sampled Gaussian mechanism, used
by the accountant, holds under add/remove-one adjacency. dpsynth's unit of privacy elsewhere (GS-WGAN's
accountant, the release statement) is replace-one. Replacing a row is a removal then an addition, so an
add/remove (epsilon, delta) gives replace-one only through group privacy of size two, (2 epsilon,
(1 + e^epsilon) delta), or through a separate replace-one analysis (sensitivity 2C);
`dpsynth.models.privacy.dpsgd_accountant.replace_one_epsilon` gives the first. The epsilons recorded here ("adjacency":
"add/remove-one") must not be reported as replace-one, nor their RDP added to a replace-one curve
(models/privacy/lifetime.py).

Beyond the paper, all off by default in `DPAutoGANConfig` (profiles choose them):
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
from dpsynth.models.generators.dpcgan.trainer import clipped_sum
from dpsynth.models.generators.gswgan.sanitizer import zero_nonfinite_rows
from dpsynth.models.generators.networks import (
    LEAKY_SLOPE,
    OutputHead,
    binary_columns,
    init_generator_,
    one_hot_groups,
)
from dpsynth.models.privacy.counter_random import normals, stream_base
from dpsynth.models.privacy.secret import PrivacySecret

STATE_FILE = "training_state.pt"
LEDGER_FILE = "ledger.json"
HEADS = ("tanh", "typed")
CRITIC_SPACES = ("data", "latent")
# How a sampled row's discrete columns become levels: the decoder's most likely level, or a level drawn
# from the decoder's probabilities. Argmax loses every level that is never the most likely one for any
# latent (rare levels of a wide column); drawing keeps each level at the share the decoder gives it.
LEVEL_DECODINGS = ("argmax", "sample")
# What phase 2 fits to the private autoencoder's latents: the paper's WGAN (a private critic, many
# updates), or one Gaussian: the latents' sums and sums of products released once by the Gaussian
# mechanism, and latents drawn from N(mean, covariance) clipped to the encoder's range.
LATENT_MODELS = ("gan", "gaussian")
ADJACENCY = "add/remove-one"
# Keeps BCE's logarithms finite where a Tanh or softmax output saturates at exactly 0 or 1.
_PROB_EPS = 1e-6


# ---------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------

def _mlp(width: int, hidden: tuple[int, ...], out: int) -> list[nn.Module]:
    """Linear / LayerNorm / LeakyReLU(0.2) hidden layers, then a Linear to `out`. LayerNorm, not
    BatchNorm: it works on one row at a time, so a row's per-example gradient (and its clipped
    contribution) does not depend on the other rows of the batch."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, h), nn.LayerNorm(h), nn.LeakyReLU(LEAKY_SLOPE)]
        width = h
    layers.append(nn.Linear(width, out))
    return layers


def _check_groups(groups, width: int) -> tuple[tuple[int, int, str], ...]:
    checked = tuple((int(g[0]), int(g[1]), str(g[2]) if len(g) > 2 else "") for g in groups)
    if any(not 0 <= a < b <= width for a, b, _ in checked):
        raise ConfigError(f"the encoding's blocks must lie within the encoded width {width}, got {checked}")
    return checked


class Autoencoder(nn.Module):
    """Encoder rows -> latents in [-1, 1] (Tanh); decoder latents -> rows through `OutputHead`."""

    def __init__(self, width: int, latent_dim: int, encoder_hidden: tuple[int, ...],
                 decoder_hidden: tuple[int, ...], head: str, groups):
        super().__init__()
        self.encoder = nn.Sequential(*_mlp(width, encoder_hidden, latent_dim), nn.Tanh())
        self.decoder = Decoder(latent_dim, decoder_hidden, width, head, groups)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(rows))


class Decoder(nn.Module):
    """Latents -> encoded rows in [-1, 1]; "typed" keeps each one-hot group a distribution."""

    def __init__(self, latent_dim: int, hidden: tuple[int, ...], width: int, head: str, groups):
        super().__init__()
        if head not in HEADS:
            raise ConfigError(f"the decoder's head must be one of {', '.join(HEADS)}, got {head!r}")
        self.body = nn.Sequential(*_mlp(latent_dim, hidden, width))
        self.head = OutputHead(head, _check_groups(groups, width))

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(latents))


class LatentGenerator(nn.Module):
    """z -> latents in [-1, 1] (the encoder's range). Trained without privacy: it reads no data."""

    def __init__(self, z_dim: int, hidden: tuple[int, ...], latent_dim: int):
        super().__init__()
        self.z_dim = z_dim
        self.body = nn.Sequential(*_mlp(z_dim, hidden, latent_dim), nn.Tanh())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.body(z)


class GaussianLatent(nn.Module):
    """z ~ N(0, I) -> mean + scale z, clipped to the encoder's range [-1, 1]: the "gaussian" latent model.
    `mean` and `scale` (a Cholesky factor of the covariance) are buffers, set by `fit_gaussian_latent`."""

    def __init__(self, latent_dim: int):
        super().__init__()
        self.z_dim = latent_dim
        self.register_buffer("mean", torch.zeros(latent_dim))
        self.register_buffer("scale", torch.eye(latent_dim))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return (self.mean + z @ self.scale.T).clamp(-1.0, 1.0)


def latent_statistics(latents: torch.Tensor) -> torch.Tensor:
    """One row per latent: the latent and the upper triangle (diagonal included) of its outer product."""
    return moment_statistics(latents, [False] * latents.shape[1])


def gaussian_bound(latent_dim: int) -> float:
    """The largest norm of one row's `latent_statistics`: latents lie in [-1, 1], so each of the d + d(d + 1)/2
    entries is at most 1 in size. Adding or removing a row moves the sums by at most this much."""
    return moment_bound(latent_dim, 0)


def noisy_sums(stats: torch.Tensor, noise_multiplier: float, bound: float, rng: torch.Generator) -> torch.Tensor:
    """The Gaussian mechanism on per-row statistics of norm at most `bound`: their float64 sums plus one
    N(0, (sigma x bound)^2) draw per entry from `rng`."""
    sums = stats.double().sum(0)
    return sums + torch.randn(sums.shape, generator=rng, dtype=torch.float64) * noise_multiplier * bound


def fit_gaussian_latent(latents: torch.Tensor, noise_multiplier: float,
                        rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gaussian mechanism on the latents' sums: N(0, (sigma x bound)^2) added once to each entry of
    the summed statistics (float64), then mean and covariance from the noisy sums divided by the number
    of rows (fixed between replace-one neighbours), the covariance projected onto the positive definite
    matrices (eigenvalues at least 1e-6). Returns the mean and a Cholesky factor of the covariance."""
    n, d = latents.shape
    # A row with a NaN latent (a diverged encoder) would carry NaN into the sums: zeroed, it stays in bound.
    sums = noisy_sums(latent_statistics(zero_nonfinite_rows(latents.double())), noise_multiplier,
                      gaussian_bound(d), rng)
    mean = sums[:d] / n
    upper = torch.triu_indices(d, d)
    second = torch.zeros(d, d, dtype=torch.float64)
    second[upper[0], upper[1]] = sums[d:] / n
    second = second + second.T - torch.diag(second.diagonal())
    values, vectors = torch.linalg.eigh(second - torch.outer(mean, mean))
    covariance = vectors @ torch.diag(values.clamp(min=1e-6)) @ vectors.T
    return mean.float(), torch.linalg.cholesky(covariance).float()


def moment_statistics(rows: torch.Tensor, binary: list[bool]) -> torch.Tensor:
    """One row per data row: its values, their pairwise products and the squares of the columns that are
    not binary (a binary column is +-1, so its square is 1 on every row and tells nothing)."""
    m = rows.shape[1]
    upper = torch.triu_indices(m, m)
    keep = [(i != j) or not binary[i] for i, j in zip(upper[0].tolist(), upper[1].tolist())]
    upper = upper[:, torch.tensor(keep, dtype=torch.bool)]
    return torch.cat([rows, rows[:, upper[0]] * rows[:, upper[1]]], 1)


def moment_bound(n_columns: int, n_binary: int) -> float:
    """The largest norm of one row's `moment_statistics` once its values are clipped to [-1, 1]: every
    entry is at most 1 in size."""
    m = n_columns
    return math.sqrt(m + m * (m - 1) / 2 + (m - n_binary))


def spread_columns(rows: torch.Tensor, center: torch.Tensor | None, width: torch.Tensor | None) -> torch.Tensor:
    """(rows - center) / width per column, clipped to [-1, 1]; without a center and width the rows clipped."""
    if center is not None:
        rows = (rows - center) / width
    return rows.clamp(-1.0, 1.0)


def moment_spread_from(decoded: torch.Tensor, binary: list[bool], spread: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A center and width per column from decoded rows (a function of private outputs only): each
    non-binary column centred at its mean and `spread` standard deviations wide on either side, so that
    the clipped values use [-1, 1] (the public bounds are wide, and the rows' values fill a small part
    of them: their products would sit below the moment query's noise); binary columns as they are."""
    center = decoded.double().mean(0)
    width = spread * decoded.double().std(0).clamp(min=1e-3)
    keep = torch.tensor(binary, dtype=torch.bool)
    center[keep], width[keep] = 0.0, 1.0
    return center, width


def private_moments(rows: torch.Tensor, binary: list[bool], noise_multiplier: float, rng: torch.Generator,
                    center: torch.Tensor | None = None, width: torch.Tensor | None = None) -> torch.Tensor:
    """The Gaussian mechanism on the sums of the rows' `moment_statistics` (values spread by `center` and
    `width` when given, which must not depend on the rows themselves, then clipped to [-1, 1], so one row
    moves the sums by at most `moment_bound`): N(0, (sigma x bound)^2) once per entry, float64, divided by
    the number of rows (fixed between replace-one neighbours)."""
    stats = moment_statistics(zero_nonfinite_rows(spread_columns(rows.double(), center, width)), binary)
    return noisy_sums(stats, noise_multiplier, moment_bound(rows.shape[1], sum(binary)), rng) / rows.shape[0]


def match_decoded_moments(decoder: Decoder, mean: torch.Tensor, scale: torch.Tensor, columns: tuple[int, ...],
                          binary: list[bool], targets: torch.Tensor, steps: int, anchor: float,
                          rng: torch.Generator, draws: int = 16384, center: torch.Tensor | None = None,
                          width: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Post-processing of private outputs only: move the Gaussian latent's mean and Cholesky factor so
    that the decoded rows' expected `moment_statistics` on `columns` come close to `targets` (the private
    moments), by `steps` Adam steps on fixed N(0, I) draws from `rng`, plus `anchor` times the squared
    distance to the start (the private fit). A drawn binary column's expectation given z is the decoder's
    output, so the expected moments of drawn rows are those of the decoder's outputs. The latents are
    clipped to [-1, 1] as the sampler clips them (the gradient passes the clip unchanged). `center` and
    `width`: the spread the query used (`private_moments`)."""
    eps = torch.randn(draws, mean.shape[0], generator=rng)
    mu, factor = mean.clone().requires_grad_(True), scale.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([mu, factor], lr=0.01)
    wanted = targets.float()
    trainable = [p.requires_grad for p in decoder.parameters()]
    for p in decoder.parameters():
        p.requires_grad_(False)
    try:
        for _ in range(steps):
            z = mu + eps @ torch.tril(factor).T
            z = z + (z.clamp(-1.0, 1.0) - z).detach()
            got = moment_statistics(spread_columns(decoder(z)[:, list(columns)], center, width), binary).mean(0)
            loss = ((got - wanted) ** 2).sum() + anchor * (((mu - mean) ** 2).sum()
                                                           + ((torch.tril(factor) - scale) ** 2).sum())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        for p, was in zip(decoder.parameters(), trainable):
            p.requires_grad_(was)
    return mu.detach(), torch.tril(factor.detach())


class Critic(nn.Module):
    """Rows (or latents) -> one WGAN score per row; linear output."""

    def __init__(self, in_width: int, hidden: tuple[int, ...]):
        super().__init__()
        self.body = nn.Sequential(*_mlp(in_width, hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).squeeze(-1)


def reconstruction_loss(recon: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The paper's binary cross entropy on [0, 1]-scaled values, summed over columns (each times its
    weight, when given): one value per row."""
    p = ((recon + 1.0) * 0.5).clamp(_PROB_EPS, 1.0 - _PROB_EPS)
    t = ((rows + 1.0) * 0.5).clamp(0.0, 1.0)
    loss = F.binary_cross_entropy(p, t, reduction="none")
    return (loss if weights is None else loss * weights).sum(-1)


# ---------------------------------------------------------------------------------------------------
# Per-example gradients and the sanitised sum
# ---------------------------------------------------------------------------------------------------

def _per_example(module: nn.Module, loss_one: Callable, *batched: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-example gradients of `loss_one(params, *one_row_each)` for every trainable parameter of
    `module`: shape [rows, *parameter shape]. An empty batch gives zero rows."""
    params = {k: v.detach() for k, v in module.named_parameters() if v.requires_grad}
    if batched[0].shape[0] == 0:
        return {k: v.new_zeros((0, *v.shape)) for k, v in params.items()}
    return vmap(grad(loss_one), in_dims=(None,) + (0,) * len(batched))(params, *batched)


def autoencoder_per_example(ae: Autoencoder, rows: torch.Tensor,
                            weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Each row's gradient of its (weighted) reconstruction loss, for encoder AND decoder weights."""

    def loss_one(p, row):
        recon = functional_call(ae, p, (row.unsqueeze(0),))
        return reconstruction_loss(recon, row.unsqueeze(0), weights).squeeze(0)

    return _per_example(ae, loss_one, rows)


def critic_per_pair(critic: Critic, real: torch.Tensor, fake: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each (real row j, fake row j) pair's gradient of D(fake_j) - D(real_j): the paper's microbatch of
    one real example with its own fake, clipped as ONE vector (Algorithm 4, lines 8-11)."""
    if real.shape[0] != fake.shape[0]:
        raise ValueError(f"one fake per real example: got {real.shape[0]} real and {fake.shape[0]} fake rows")

    def loss_one(p, r, f):
        scores = functional_call(critic, p, (torch.stack([r, f]),))
        return scores[1] - scores[0]

    return _per_example(critic, loss_one, real, fake.detach())


@dataclass
class SanitizedGradient:
    """One private update's gradient, per parameter name: `total` = (clipped_sum + noise) / expected batch."""

    clipped_sum: dict[str, torch.Tensor]
    noise: dict[str, torch.Tensor]
    total: dict[str, torch.Tensor]


def sanitize(per_example: dict[str, torch.Tensor], clip: float, noise_multiplier: float,
             expected_batch: float, noise_rng: torch.Generator | None) -> SanitizedGradient:
    """DP-SGD's sanitised mean: each example clipped to `clip` (joint norm over all parameters), summed,
    ONE draw of N(0, (noise_multiplier clip)^2 I) from `noise_rng` in parameter order, divided by the
    public expected batch q m (the drawn batch size is not public)."""
    summed = clipped_sum(per_example, clip)
    std = noise_multiplier * clip
    noise = {k: (torch.randn(g.shape, generator=noise_rng, dtype=g.dtype).mul_(std) if std > 0
                 else torch.zeros_like(g)) for k, g in summed.items()}
    total = {k: (summed[k] + noise[k]) / expected_batch for k in summed}
    return SanitizedGradient(summed, noise, total)


def position_latents(key: int, update: int, positions: torch.Tensor, z_dim: int) -> torch.Tensor:
    """Standard normal latents [len(positions), z_dim], one vector per (update, row position): a fixed
    function of (key, update, position), drawn by a counter-based generator (SplitMix64 on the counter,
    Box-Muller on two 53-bit uniforms).

    The critic pairs each sampled real row with the fake made from its own position's latent. Drawing
    the fakes in sampled order from a stream instead would make every later row's fake, and everything
    the stream draws afterwards, depend on whether row i was sampled: adding or removing a row would
    move every pair after it, and later updates would depend on a sampling outcome that subsampling's
    amplification must keep hidden from them. Here a row's pair depends on that row, its position (its
    identity: replace-one neighbours share positions) and the update only, and no stream advances."""
    pos = positions.detach().cpu().numpy().astype(np.uint64)
    base = stream_base(key, update)
    with np.errstate(over="ignore"):
        index = base + pos[:, None] * np.uint64(z_dim) + np.arange(z_dim, dtype=np.uint64)[None, :]
    return torch.from_numpy(normals(index).astype(np.float32)).reshape(len(pos), z_dim)


def poisson_batch(n_rows: int, sample_rate: float, rng: torch.Generator) -> torch.Tensor:
    """Indices of a Poisson batch: each row independently with probability `sample_rate`."""
    return (torch.rand(n_rows, generator=rng) < sample_rate).nonzero().squeeze(1)


# ---------------------------------------------------------------------------------------------------
# Configuration and the released model's spec
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DPAutoGANConfig:
    """One DP-auto-GAN run. Defaults follow the paper's ADULT run at epsilon 0.51 (appendix B.1): the
    autoencoder 106 -> 60 -> 15, batch 64, C 0.012, psi 2.5, Adam lr 0.005, 10,000 steps; the critic
    batch 128, C 0.022, psi 7.5, RMSprop lr 0.005, 15 critic updates per generator step, 15,000 critic
    updates. The clipping norms were tuned to the paper's scaling; re-pick them for another table."""

    autoencoder_batch: int = 64
    autoencoder_clip: float = 0.012
    autoencoder_noise: float = 2.5
    autoencoder_steps: int = 10_000
    critic_batch: int = 128
    critic_clip: float = 0.022
    critic_noise: float = 7.5
    critic_steps: int = 15
    generator_steps: int = 1_000
    generator_batch: int = 128
    checkpoint_every: int = 500
    latent_dim: int = 15
    z_dim: int = 64
    encoder_hidden: tuple[int, ...] = (60,)
    decoder_hidden: tuple[int, ...] = (60,)
    generator_hidden: tuple[int, ...] = (64, 64)
    critic_hidden: tuple[int, ...] = (70, 35)
    critic_space: str = "data"
    head: str = "typed"
    level_decoding: str = "sample"
    lr_autoencoder: float = 0.005
    lr_critic: float = 0.005
    lr_generator: float = 0.005
    delta: float = 1e-5
    # Fixed, public sampling rates q1 and q3; null derives them from the batches (batch / n, as the
    # paper). Given, the accountant's inputs are all public and the divisors are q n; the batches unused.
    autoencoder_rate: float | None = None
    critic_rate: float | None = None
    # Each encoded column's weight in the reconstruction loss; None weighs all alike (the paper). Summed
    # BCE lets a wide table's many one-hot columns drown its few continuous ones and the target.
    reconstruction_weights: tuple[float, ...] | None = None
    latent_model: str = "gan"
    # The Gaussian fit's noise multiplier: noise sigma x the bound on one row's statistics (`gaussian_bound`).
    latent_noise: float = 20.0
    # With the Gaussian latent model: encoded columns whose first and second moments the decoded rows are
    # fitted to (the schema's continuous columns and binary target); None: no moment fit. The moments are
    # one more Gaussian-mechanism query (noise multiplier `moment_noise`, `moment_bound`), then
    # `moment_steps` Adam steps move the Gaussian's mean and factor, held near the fit by `moment_anchor`.
    moment_columns: tuple[int, ...] | None = None
    moment_noise: float = 20.0
    moment_steps: int = 300
    moment_anchor: float = 1e-3
    # None: the moments of the encoded values as they are. A number k: of each non-binary column centred
    # and scaled to k standard deviations of the rows the fitted Gaussian decodes to (`moment_spread_from`).
    moment_spread: float | None = None

    def __post_init__(self) -> None:
        for name in ("autoencoder_batch", "autoencoder_steps", "critic_batch", "critic_steps", "generator_batch",
                     "checkpoint_every", "latent_dim", "z_dim"):
            _require_int(name, getattr(self, name), 1)
        _require_int("generator_steps", self.generator_steps, 0)
        for name in ("autoencoder_clip", "autoencoder_noise", "critic_clip", "critic_noise", "lr_autoencoder",
                     "lr_critic", "lr_generator"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"dpautogan.{name} must be a finite number > 0, got {value!r}")
        if not 0 < self.delta < 1:
            raise ConfigError(f"dpautogan.delta must be in (0, 1), got {self.delta!r}")
        for name in ("autoencoder_rate", "critic_rate"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                raise ConfigError(f"dpautogan.{name} must be in (0, 1], got {value!r}")
        if self.head not in HEADS:
            raise ConfigError(f"dpautogan.head must be one of {', '.join(HEADS)}, got {self.head!r}")
        check_level_decoding(self.level_decoding, self.head)
        if self.latent_model not in LATENT_MODELS:
            raise ConfigError(f"dpautogan.latent_model must be one of {', '.join(LATENT_MODELS)}, "
                              f"got {self.latent_model!r}")
        if not isinstance(self.latent_noise, (int, float)) or not math.isfinite(self.latent_noise) \
                or self.latent_noise <= 0:
            raise ConfigError(f"dpautogan.latent_noise must be a finite number > 0, got {self.latent_noise!r}")
        if self.moment_columns is not None:
            columns = tuple(int(c) for c in self.moment_columns)
            if self.latent_model != "gaussian" or not columns or len(set(columns)) != len(columns):
                raise ConfigError("dpautogan.moment_columns needs latent_model gaussian and distinct columns")
            object.__setattr__(self, "moment_columns", columns)
            for name in ("moment_noise", "moment_anchor"):
                value = getattr(self, name)
                if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or \
                        (name == "moment_noise" and value == 0):
                    raise ConfigError(f"dpautogan.{name} must be a finite number "
                                      f"{'> 0' if name == 'moment_noise' else '>= 0'}, got {value!r}")
            _require_int("moment_steps", self.moment_steps, 1)
            spread = self.moment_spread
            if spread is not None and (not isinstance(spread, (int, float)) or not math.isfinite(spread) or spread <= 0):
                raise ConfigError(f"dpautogan.moment_spread must be a finite number > 0 or null, got {spread!r}")
        if self.critic_space not in CRITIC_SPACES:
            raise ConfigError(f"dpautogan.critic_space must be one of {', '.join(CRITIC_SPACES)}, "
                              f"got {self.critic_space!r}")
        for name in ("encoder_hidden", "decoder_hidden", "generator_hidden", "critic_hidden"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.reconstruction_weights is not None:
            weights = tuple(float(w) for w in self.reconstruction_weights)
            if not weights or not all(math.isfinite(w) and w > 0 for w in weights):
                raise ConfigError("dpautogan.reconstruction_weights must be finite numbers > 0, one per encoded column")
            object.__setattr__(self, "reconstruction_weights", weights)

    @property
    def phase2_steps(self) -> int:
        """The GAN's generator steps, or the Gaussian's one fit."""
        return 1 if self.latent_model == "gaussian" else self.generator_steps

    @property
    def total_steps(self) -> int:
        return self.autoencoder_steps + self.phase2_steps

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def check_level_decoding(level_decoding: str, head: str) -> None:
    if level_decoding not in LEVEL_DECODINGS:
        raise ConfigError(f"dpautogan.level_decoding must be one of {', '.join(LEVEL_DECODINGS)}, "
                          f"got {level_decoding!r}")
    if level_decoding == "sample" and head != "typed":
        raise ConfigError("dpautogan.level_decoding: sample needs head: typed (its softmax gives each one-hot "
                          "group's level probabilities)")


def _require_int(name: str, value, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ConfigError(f"dpautogan.{name} must be an integer >= {least}, got {value!r}")


@dataclass(frozen=True)
class ReleaseSpec:
    """Everything needed to rebuild the released decoder and generator, stored beside their weights."""

    width: int
    latent_dim: int
    z_dim: int
    decoder_hidden: tuple[int, ...]
    generator_hidden: tuple[int, ...]
    head: str
    groups: tuple[tuple[int, int, str], ...]
    # Files written before these options existed decoded by argmax and had a GAN's generator.
    level_decoding: str = "argmax"
    latent_model: str = "gan"

    def build(self) -> tuple[Decoder, LatentGenerator | GaussianLatent]:
        latent = (GaussianLatent(self.latent_dim) if self.latent_model == "gaussian"
                  else LatentGenerator(self.z_dim, self.generator_hidden, self.latent_dim))
        return Decoder(self.latent_dim, self.decoder_hidden, self.width, self.head, self.groups), latent

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(decoder_hidden=list(self.decoder_hidden), generator_hidden=list(self.generator_hidden),
                 groups=[list(g) for g in self.groups])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ReleaseSpec:
        return cls(int(d["width"]), int(d["latent_dim"]), int(d["z_dim"]), tuple(d["decoder_hidden"]),
                   tuple(d["generator_hidden"]), d["head"], tuple((int(a), int(b), str(c)) for a, b, c in d["groups"]),
                   d.get("level_decoding", "argmax"), d.get("latent_model", "gan"))


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------

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

    def __init__(self, data: torch.Tensor, groups, config: DPAutoGANConfig, seed: int, secret: PrivacySecret,
                 checkpoint_dir: str | Path):
        self.config = cfg = config
        self.data = torch.as_tensor(data, dtype=torch.float32)
        n, width = self.data.shape
        for name, rate in (("autoencoder_batch", cfg.autoencoder_rate), ("critic_batch", cfg.critic_rate)):
            if rate is None and getattr(cfg, name) > n:
                raise ConfigError(f"dpautogan.{name} ({getattr(cfg, name)}) exceeds the {n} training rows")
        self.ae_rate = cfg.autoencoder_batch / n if cfg.autoencoder_rate is None else float(cfg.autoencoder_rate)
        self.critic_rate = cfg.critic_batch / n if cfg.critic_rate is None else float(cfg.critic_rate)
        # The sanitised sums' divisors: the expected batches q n (never a drawn batch's size).
        self.ae_divisor = cfg.autoencoder_batch if cfg.autoencoder_rate is None else self.ae_rate * n
        self.critic_divisor = cfg.critic_batch if cfg.critic_rate is None else self.critic_rate * n
        self.loss_weights = None
        if cfg.reconstruction_weights is not None:
            if len(cfg.reconstruction_weights) != width:
                raise ConfigError(f"dpautogan.reconstruction_weights has {len(cfg.reconstruction_weights)} "
                                  f"weights for {width} encoded columns")
            self.loss_weights = torch.tensor(cfg.reconstruction_weights, dtype=torch.float32)
        self._binary = set(binary_columns(_check_groups(groups, width)))
        if cfg.moment_columns is not None and max(cfg.moment_columns) >= width:
            raise ConfigError(f"dpautogan.moment_columns must be encoded columns below {width}")
        self.spec = ReleaseSpec(width, cfg.latent_dim, cfg.z_dim, cfg.decoder_hidden, cfg.generator_hidden, cfg.head,
                                _check_groups(groups, width), cfg.level_decoding, cfg.latent_model)
        self.dir = Path(checkpoint_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = torch.Generator().manual_seed(int(seed))
        self.autoencoder = Autoencoder(width, cfg.latent_dim, cfg.encoder_hidden, cfg.decoder_hidden, cfg.head, groups)
        self.generator = LatentGenerator(cfg.z_dim, cfg.generator_hidden, cfg.latent_dim)
        self.gaussian = GaussianLatent(cfg.latent_dim)   # fitted by the "gaussian" latent model only
        self.critic = Critic(width if cfg.critic_space == "data" else cfg.latent_dim, cfg.critic_hidden)
        for net in (self.autoencoder, self.generator, self.critic):
            init_generator_(net, "default", self.rng)  # PyTorch's default init, drawn from the seed's stream
        self.sampling_rng = secret.torch("dpautogan-sampling")
        self.noise_rng = secret.torch("dpautogan-noise")
        self.fake_key = secret.seed("dpautogan-fakes")   # `position_latents`: the critic's fakes per row
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
        _apply(self.autoencoder, parts.total, self.opt_ae)
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
        parts = sanitize(critic_per_pair(self.critic, real, fake), cfg.critic_clip, cfg.critic_noise,
                         self.critic_divisor, self.noise_rng)
        _apply(self.critic, parts.total, self.opt_critic)
        return int(index.numel()), parts

    def generator_update(self) -> float:
        """One ordinary generator step: reads only the (private) critic and the frozen decoder."""
        _, fake = self.critic_inputs(self.data[:0], self.fake_latents(self.config.generator_batch))
        loss = -self.critic(fake).mean()
        grads = torch.autograd.grad(loss, list(self.generator.parameters()))
        for p, g in zip(self.generator.parameters(), grads):
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
        columns = cfg.moment_columns
        binary = [c in self._binary for c in columns]
        center = width = None
        if cfg.moment_spread is not None:   # from rows the private Gaussian and decoder make: post-processing
            with torch.no_grad():
                z = self.gaussian(torch.randn(16384, cfg.latent_dim, generator=self.rng))
                center, width = moment_spread_from(self.autoencoder.decoder(z)[:, list(columns)], binary,
                                                   cfg.moment_spread)
        targets = private_moments(self.data[:, list(columns)], binary, cfg.moment_noise, self.noise_rng, center, width)
        mean, scale = match_decoded_moments(self.autoencoder.decoder, self.gaussian.mean, self.gaussian.scale,
                                            columns, binary, targets, cfg.moment_steps, cfg.moment_anchor, self.rng,
                                            center=center, width=width)
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
            if cfg.moment_columns is not None:
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
        return self.accountant.epsilon(self.config.delta, "classic")

    def _save_checkpoint(self) -> None:
        step, eps = self.step_index, self.epsilon()
        release = self.dir / f"release_{step:06d}.pt"
        digest = save_verified({"spec": self.spec.to_dict(), "decoder": self.autoencoder.decoder.state_dict(),
                                "generator": self.released_latent().state_dict(), "step": step, "epsilon": eps,
                                "delta": self.config.delta, "adjacency": ADJACENCY}, release)
        self.ledger = [e for e in self.ledger if e["step"] < step] + [
            {"step": step,
             "phase": "autoencoder" if step <= self.config.autoencoder_steps else self.config.latent_model,
             "epsilon": eps, "release": release.name, "sha256": digest}]
        state = {
            "step": step, "config": self.config.to_dict(), "rows": int(self.data.shape[0]),
            "autoencoder": self.autoencoder.state_dict(), "generator": self.generator.state_dict(),
            "critic": self.critic.state_dict(), "gaussian": self.gaussian.state_dict(),
            "opt_ae": self.opt_ae.state_dict(), "opt_critic": self.opt_critic.state_dict(),
            "opt_g": self.opt_g.state_dict(),
            "accountant": self.accountant.state_dict(), "rng": self.rng.get_state(),
            "sampling_rng": self.sampling_rng.get_state(), "noise_rng": self.noise_rng.get_state(),
            "ledger": self.ledger,
        }
        save_training_state(state, self.dir / STATE_FILE)
        write_text_atomic(json.dumps({"mechanism": self.accountant.mechanism, "adjacency": ADJACENCY,
                                      "checkpoints": self.ledger}, indent=1), self.dir / LEDGER_FILE)

    def _load_state(self) -> bool:
        """Resume from the newest intact training state (the latest, else the one before it)."""
        state, self.resume_notes = resume_state(
            self.dir / STATE_FILE, "step", written_for={"config": self.config.to_dict(), "rows": self.data.shape[0]})
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
            self.config.autoencoder_steps, self.config.total_steps)

    def run(self, stop_after: int | None = None,
            progress: Callable[[int, float], None] | None = None, last_step: int | None = None) -> TrainingResult:
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


def _apply(module: nn.Module, total: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
    """Step `optimizer` with exactly the sanitised gradient (any stale gradient is overwritten)."""
    for name, p in module.named_parameters():
        p.grad = total[name]
    optimizer.step()


# ---------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------

def load_release(path: str | Path, sha256: str | None = None) -> tuple[Decoder, nn.Module, dict]:
    """A released checkpoint's decoder and latent model (generator or Gaussian), checked against its
    SHA-256 (ledger's, else sidecar's)."""
    blob = load_verified(Path(path), sha256, map_location="cpu", weights_only=False)
    decoder, generator = ReleaseSpec.from_dict(blob["spec"]).build()
    decoder.load_state_dict(blob["decoder"])
    generator.load_state_dict(blob["generator"])
    return decoder.eval(), generator.eval(), blob


def sample_encoded(decoder: Decoder, generator: LatentGenerator | GaussianLatent, n_rows: int, seed: int,
                   batch: int = 8192, level_decoding: str = "argmax") -> np.ndarray:
    """n encoded rows in [-1, 1]: z ~ N(0, I) from `seed` -> generator -> decoder; with `level_decoding`
    "sample", each discrete column then gets a level drawn from the decoder's probabilities (uniforms
    from the same stream, after each batch's z; see `draw_levels`)."""
    check_level_decoding(level_decoding, decoder.head.kind)
    rng = torch.Generator().manual_seed(int(seed))
    groups = one_hot_groups(decoder.head.groups) if level_decoding == "sample" else []
    binary = binary_columns(decoder.head.groups) if level_decoding == "sample" else []
    parts = []
    with torch.no_grad():
        for start in range(0, n_rows, batch):
            z = torch.randn(min(batch, n_rows - start), generator.z_dim, generator=rng)
            rows = decoder(generator(z))
            if groups or binary:
                uniforms = torch.rand(rows.shape[0], len(groups) + len(binary), generator=rng)
                rows = draw_levels(rows, groups, binary, uniforms)
            parts.append(rows.numpy())
    width = decoder.body[-1].out_features
    return np.concatenate(parts) if parts else np.zeros((0, width), dtype=np.float32)


def draw_levels(rows: torch.Tensor, groups, binary, uniforms: torch.Tensor) -> torch.Tensor:
    """Rows whose discrete columns are replaced by +-1 draws from the decoder's probabilities, one uniform
    per row and column (the groups' first, then the binary columns'). A one-hot group (a softmax mapped
    to [-1, 1]) gets level k where its cumulative probability first exceeds the uniform; a binary column
    x (trained by cross entropy on (x + 1) / 2) is +1 with probability (x + 1) / 2."""
    out = rows.clone()
    for g, (start, stop) in enumerate(groups):
        cumulative = torch.cumsum((rows[:, start:stop] + 1.0) * 0.5, dim=1)
        # Scaled by the row's total so rounding never leaves a uniform above the last level's sum.
        threshold = uniforms[:, g:g + 1] * cumulative[:, -1:]
        level = (cumulative <= threshold).sum(dim=1).clamp(max=stop - start - 1)
        block = torch.full_like(rows[:, start:stop], -1.0)
        block[torch.arange(rows.shape[0]), level] = 1.0
        out[:, start:stop] = block
    for b, column in enumerate(binary):
        positive = uniforms[:, len(groups) + b] < (rows[:, column] + 1.0) * 0.5
        out[:, column] = torch.where(positive, 1.0, -1.0)
    return out


__all__ = [
    "Autoencoder",
    "Critic",
    "DPAutoGANConfig",
    "DPAutoGANTrainer",
    "Decoder",
    "GaussianLatent",
    "LatentGenerator",
    "ReleaseSpec",
    "SanitizedGradient",
    "TrainingResult",
    "UpdateInfo",
    "autoencoder_per_example",
    "critic_per_pair",
    "draw_levels",
    "fit_gaussian_latent",
    "gaussian_bound",
    "latent_statistics",
    "load_release",
    "match_decoded_moments",
    "moment_bound",
    "moment_spread_from",
    "moment_statistics",
    "poisson_batch",
    "private_moments",
    "reconstruction_loss",
    "sample_encoded",
    "sanitize",
    "spread_columns",
]
