"""CTGAN's conditional vector without the category frequencies leaving a site in the clear.

The vector has one one-hot segment per discrete (binary or categorical) column of the schema; a
condition sets one level of one column, the column drawn uniformly. A real row's condition is its own
level in that column (a function of the row and public randomness only: DP-SGD's per-row clipping
covers it). A generated row's condition draws the level from the *noisy global* level shares: each
site sends its row count and level counts once, with Gaussian noise (`noisy_counts`), and the server
adds them up (`shares_from_counts`). CTGAN's training-by-sampling draws real rows matching a condition,
which Poisson sampling cannot do; here the real conditions follow the rows and the generated ones the
noisy shares, so both sides of the discriminator see the same condition distribution up to that noise.
The noisy shares are also what the released sampler draws conditions from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from dpsynth.models.privacy.counter_random import stream_base, uniforms


@dataclass(frozen=True)
class ConditionLayout:
    """Where each discrete column sits in an encoded row and in the conditional vector."""

    blocks: tuple[tuple[int, int, str], ...]  # (start, stop, kind) in the encoded row, discrete columns only

    @classmethod
    def from_groups(cls, groups: Iterable[tuple[int, int, str]]) -> ConditionLayout:
        return cls(tuple((int(g[0]), int(g[1]), str(g[2])) for g in groups if str(g[2]) != "continuous"))

    @property
    def levels(self) -> tuple[int, ...]:
        """Levels of each discrete column (a binary column's two)."""
        return tuple(2 if kind == "binary" else stop - start for start, stop, kind in self.blocks)

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(int(x) for x in np.cumsum((0,) + self.levels)[:-1])

    @property
    def width(self) -> int:
        return sum(self.levels)

    def level_codes(self, rows: torch.Tensor) -> torch.Tensor:
        """[rows, discrete columns] level index of each row in each discrete column."""
        codes = [
            (rows[:, start] > 0).long() if kind == "binary" else rows[:, start:stop].argmax(dim=1)
            for start, stop, kind in self.blocks
        ]
        return torch.stack(codes, 1) if codes else torch.zeros((rows.shape[0], 0), dtype=torch.long)

    def one_hot(self, columns: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
        """Conditions setting level `levels[i]` of discrete column `columns[i]`, one row each."""
        cond = torch.zeros(columns.shape[0], self.width)
        if self.width:
            offsets = torch.tensor(self.offsets, dtype=torch.long)
            cond[torch.arange(columns.shape[0]), offsets[columns] + levels] = 1.0
        return cond

    def real_conditions(self, rows: torch.Tensor, positions: torch.Tensor, key: np.uint64) -> torch.Tensor:
        """Each real row's own level in a column drawn uniformly from its position (its index among the
        site's rows) and `key` (the update's, `condition_key`). A counter-based draw, not a stream: a
        stream would advance by the batch's size and carry it into every public draw after it (the fake
        rows, the generator step), which must be the same under a neighbouring table."""
        if not self.blocks:
            return torch.zeros(rows.shape[0], 0)
        columns = condition_columns(positions, key, len(self.blocks))
        levels = self.level_codes(rows).gather(1, columns.unsqueeze(1)).squeeze(1)
        return self.one_hot(columns, levels)

    def sampled_conditions(self, n_rows: int, shares: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        """n_rows conditions: a column drawn uniformly, then its level from `shares` (the conditional
        vector's width: each column's segment sums to 1)."""
        if not self.blocks:
            return torch.zeros(n_rows, 0)
        columns = torch.randint(len(self.blocks), (n_rows,), generator=rng)
        u = torch.rand(n_rows, generator=rng, dtype=torch.float64)
        levels = torch.zeros(n_rows, dtype=torch.long)
        for j, (offset, count) in enumerate(zip(self.offsets, self.levels, strict=True)):
            cumulative = torch.cumsum(shares[offset : offset + count].double(), 0)
            picked = torch.searchsorted(cumulative, u.unsqueeze(1)).squeeze(1).clamp(max=count - 1)
            levels = torch.where(columns == j, picked, levels)
        return self.one_hot(columns, levels)


def condition_key(public_seed: int, step: int) -> np.uint64:
    """The counter base of one local update's real-row condition columns: the round's public seed and
    the update's step within the round (so a rerun of the round draws them again)."""
    return stream_base(public_seed, step)


def condition_columns(positions: torch.Tensor, key: np.uint64, n_columns: int) -> torch.Tensor:
    """A discrete column, uniform over `n_columns`, for each position: a fixed function of (key, position)."""
    pos = positions.detach().cpu().numpy().astype(np.uint64)
    with np.errstate(over="ignore"):
        u = uniforms(key + pos)
    picked = np.minimum((u * n_columns).astype(np.int64), n_columns - 1)
    return torch.from_numpy(picked)


def counts_sensitivity(layout: ConditionLayout) -> float:
    """L2 sensitivity of [row count, every level count] to adding or removing one row: the count and one
    level of each discrete column move by one."""
    return math.sqrt(1 + len(layout.blocks))


def exact_counts(rows: torch.Tensor, layout: ConditionLayout) -> np.ndarray:
    """[row count, level counts of each discrete column in the vector's order] of a site's rows."""
    codes = layout.level_codes(rows).numpy()
    parts = [np.array([rows.shape[0]], dtype=np.float64)]
    for j, count in enumerate(layout.levels):
        parts.append(np.bincount(codes[:, j], minlength=count).astype(np.float64))
    return np.concatenate(parts)


def noisy_counts(
    rows: torch.Tensor, layout: ConditionLayout, counts_noise: float, rng: np.random.Generator
) -> np.ndarray:
    """The counts a site sends: exact counts plus N(0, (counts_noise * sensitivity)^2) per entry, one
    draw from `rng` (the site's secret) per entry."""
    exact = exact_counts(rows, layout)
    return exact + rng.normal(0.0, counts_noise * counts_sensitivity(layout), size=exact.shape)


def shares_from_counts(total: np.ndarray, layout: ConditionLayout) -> torch.Tensor:
    """The conditional vector's level shares from the sites' summed noisy counts (`total[0]` is the row
    count): each column's noisy counts clipped at zero and normalised; uniform where nothing is left."""
    shares = []
    for offset, count in zip(layout.offsets, layout.levels, strict=True):
        part = np.clip(total[1 + offset : 1 + offset + count], 0.0, None)
        shares.append(part / part.sum() if part.sum() > 0 else np.full(count, 1.0 / count))
    return torch.tensor(np.concatenate(shares) if shares else np.zeros(0), dtype=torch.float32)
