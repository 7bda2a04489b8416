"""The candidates of model selection (thesis Algorithm 3, step 1): penalty (l1, l2) x C, with 20 values
of C drawn at random, with a seed, from a logarithmic space strictly inside (0, 1)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PENALTIES = ("l1", "l2")

# The logarithmic space of the grid: 100 points 10^-4 ... 10^-0.04, i.e. strictly inside (0, 1).
GRID_LOG10_LOW = -4.0
GRID_LOG10_HIGH = 0.0
GRID_POINTS = 100


@dataclass(frozen=True)
class Candidate:
    """One model of the grid: a penalty ("l1" or "l2") and an inverse regularisation strength C."""

    penalty: str
    C: float

    def __post_init__(self) -> None:
        if self.penalty not in PENALTIES:
            raise ValueError(f"penalty must be one of {PENALTIES}, got {self.penalty!r}")
        if not (self.C > 0 and math.isfinite(self.C)):
            raise ValueError(f"C must be a positive finite number, got {self.C!r}")


def regularisation_grid(seed: int, n_values: int = 20, penalties: Sequence[str] = PENALTIES) -> list[Candidate]:
    """The thesis' grid: `n_values` values of C drawn at random from a logarithmic space in (0, 1).

    Choice made here: the logarithmic space is ``np.logspace(-4, 0, 100, endpoint=False)`` (1e-4 up to
    10^-0.04 ~ 0.91, every point strictly inside (0, 1)); `n_values` distinct points are drawn without
    replacement with ``np.random.default_rng(seed)`` and sorted increasingly. Candidates are ordered penalty
    first (in the order of `penalties`), then by increasing C; this is the order in which ties are broken.
    """
    space = np.logspace(GRID_LOG10_LOW, GRID_LOG10_HIGH, GRID_POINTS, endpoint=False)
    if not 1 <= n_values <= space.size:
        raise ValueError(f"n_values must be in [1, {space.size}], got {n_values}")
    penalties = tuple(penalties)
    for p in penalties:
        if p not in PENALTIES:
            raise ValueError(f"unknown penalty {p!r}; expected one of {PENALTIES}")
    rng = np.random.default_rng(seed)
    cs = np.sort(rng.choice(space, size=n_values, replace=False))
    return [Candidate(p, float(c)) for p in penalties for c in cs]
