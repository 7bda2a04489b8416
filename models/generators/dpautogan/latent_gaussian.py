"""DP-auto-GAN's phase 2 as one Gaussian (`latent_model: gaussian`): the training rows' latents' sums and
sums of products released once by the Gaussian mechanism, a Gaussian fitted to them; then, optionally,
one more Gaussian-mechanism query of the rows' first and second moments on chosen encoded columns, to
which the Gaussian is moved through the decoder (post-processing of private outputs only)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import nn

from dpsynth.models.generators.dpautogan.networks import Decoder
from dpsynth.models.generators.sanitizer import zero_nonfinite_rows


def latent_statistics(latents: torch.Tensor) -> torch.Tensor:
    """One row per latent: the latent and the upper triangle (diagonal included) of its outer product."""
    return moment_statistics(latents, [False] * latents.shape[1])


def gaussian_bound(latent_dim: int) -> float:
    """The largest norm of one row's `latent_statistics`: latents lie in [-1, 1], so each of the d + d(d + 1)/2
    entries is at most 1 in size. Adding or removing a row moves the sums by at most this much."""
    return moment_bound(latent_dim, 0)


# Rows whose statistics are computed at once: the statistics of every row together would hold d(d + 3)/2
# float64 numbers a row (a 16-wide latent: 1.2 KB a row, a GB at 800,000 training rows).
CHUNK_ROWS = 65_536


def noisy_sums(stats: torch.Tensor, noise_multiplier: float, bound: float, rng: torch.Generator) -> torch.Tensor:
    """The Gaussian mechanism on per-row statistics of norm at most `bound`: their float64 sums plus one
    N(0, (sigma x bound)^2) draw per entry from `rng`."""
    return with_noise(stats.double().sum(0), noise_multiplier, bound, rng)


def with_noise(sums: torch.Tensor, noise_multiplier: float, bound: float, rng: torch.Generator) -> torch.Tensor:
    """`noisy_sums` given the float64 sums: one N(0, (sigma x bound)^2) draw per entry from `rng`."""
    return sums + torch.randn(sums.shape, generator=rng, dtype=torch.float64) * noise_multiplier * bound


class RowChunks(Protocol):
    """Rows read a contiguous run at a time: a tensor, `TrainingRows` (models/generators/training_rows.py),
    or `EncodedLatents`."""

    @property
    def shape(self) -> Sequence[int]: ...

    def __getitem__(self, rows: slice) -> torch.Tensor: ...


class EncodedLatents:
    """The latents a frozen `encoder` gives `rows`, encoded a run of rows at a time when read (under no
    gradient): the Gaussian fit sums their statistics without holding every row's latent."""

    def __init__(self, rows: RowChunks, encoder: nn.Module, latent_dim: int):
        self._rows, self._encoder = rows, encoder
        self.shape = (int(rows.shape[0]), int(latent_dim))

    def __getitem__(self, rows: slice) -> torch.Tensor:
        with torch.no_grad():
            return self._encoder(self._rows[rows])


def summed_statistics(rows: RowChunks, statistics: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The float64 sums over rows of `statistics(rows)`, computed `CHUNK_ROWS` rows at a time, so that
    memory does not grow with the rows (the same sums up to float64 rounding of the order of addition)."""
    total = statistics(rows[:0]).double().sum(0)
    for start in range(0, rows.shape[0], CHUNK_ROWS):
        total = total + statistics(rows[start : start + CHUNK_ROWS]).double().sum(0)
    return total


def fit_gaussian_latent(
    latents: RowChunks, noise_multiplier: float, rng: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gaussian mechanism on the latents' sums: N(0, (sigma x bound)^2) added once to each entry of
    the summed statistics (float64), then mean and covariance from the noisy sums divided by the number
    of rows (fixed between replace-one neighbours), the covariance projected onto the positive definite
    matrices (eigenvalues at least 1e-6). Returns the mean and a Cholesky factor of the covariance."""
    n, d = latents.shape
    # A row with a NaN latent (a diverged encoder) would carry NaN into the sums: zeroed, it stays in bound.
    sums = with_noise(
        summed_statistics(latents, lambda part: latent_statistics(zero_nonfinite_rows(part.double()))),
        noise_multiplier,
        gaussian_bound(d),
        rng,
    )
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
    keep = [(i != j) or not binary[i] for i, j in zip(upper[0].tolist(), upper[1].tolist(), strict=False)]
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
        if width is None:
            raise ValueError("a center needs its width")
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


def private_moments(
    rows: RowChunks,
    binary: list[bool],
    noise_multiplier: float,
    rng: torch.Generator,
    center: torch.Tensor | None = None,
    width: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Gaussian mechanism on the sums of the rows' `moment_statistics` (values spread by `center` and
    `width` when given, which must not depend on the rows themselves, then clipped to [-1, 1], so one row
    moves the sums by at most `moment_bound`): N(0, (sigma x bound)^2) once per entry, float64, divided by
    the number of rows (fixed between replace-one neighbours)."""
    sums = summed_statistics(
        rows, lambda part: moment_statistics(zero_nonfinite_rows(spread_columns(part.double(), center, width)), binary)
    )
    return with_noise(sums, noise_multiplier, moment_bound(rows.shape[1], sum(binary)), rng) / rows.shape[0]


def match_decoded_moments(
    decoder: Decoder,
    mean: torch.Tensor,
    scale: torch.Tensor,
    columns: tuple[int, ...],
    binary: list[bool],
    targets: torch.Tensor,
    steps: int,
    anchor: float,
    rng: torch.Generator,
    draws: int = 16384,
    center: torch.Tensor | None = None,
    width: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
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
            loss = ((got - wanted) ** 2).sum() + anchor * (
                ((mu - mean) ** 2).sum() + ((torch.tril(factor) - scale) ** 2).sum()
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        for p, was in zip(decoder.parameters(), trainable, strict=False):
            p.requires_grad_(was)
    return mu.detach(), torch.tril(factor.detach())
