"""How MST spends its zCDP budget under REPLACE-ONE adjacency (its two mechanisms, shared with AIM:
models/generators/graphical/mechanisms.py).

With rho the whole budget and d columns (d >= 2), a third of rho goes to each phase by default (MST as
published); `one_way_share` u1 and `selection_share` u2 move the split to u1 rho, u2 rho and the rest
(the formulas below with rho / 3 replaced by each phase's rho):

* d 1-way marginals, each by the Gaussian mechanism at noise std s1: a replaced row takes one count from
  one cell and gives one to another, so a count vector moves by L2 sqrt(2) (`L2_SENSITIVITY`) and one
  marginal costs 2 / (2 s1^2) = 1 / s1^2; d of them cost rho / 3, so s1 = sqrt(3 d / rho);
* d - 1 rounds of the exponential mechanism at epsilon e, each choosing one pair of columns: the score
  (an L1 distance between real counts and a function of earlier noisy outputs) moves by at most 2
  (`SCORE_SENSITIVITY`); the mechanism is e-DP and e-bounded-range, so a round costs e^2 / 8 zCDP
  (Cesar and Rogers 2021) and e = sqrt(8 (rho / 3) / (d - 1));
* d - 1 2-way marginals of the chosen pairs, Gaussian at s2 = sqrt(3 (d - 1) / rho).

Everything in between (which cells a column keeps, the candidate pairs, the 1-way estimate that scores
pairs) depends on earlier noisy outputs and public facts only, so the phases compose adaptively:
d / s1^2 + (d - 1) (e^2 / 8 + 1 / s2^2) = rho (`MSTBudget.spent`). Its RDP at order a is a x rho, the
curve the project's conversion turns into (epsilon, delta) with the measured marginals' rho added.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.graphical.mechanisms import exponential_mechanism, gaussian_rho, gaussian_std


@dataclass(frozen=True)
class MSTBudget:
    """How MST spends `rho` (zCDP, replace-one) on a table of `columns` columns."""

    rho: float
    columns: int
    # Shares of rho for the 1-way marginals and for the selection; the 2-way marginals take the rest.
    one_way_share: float = 1.0 / 3.0
    selection_share: float = 1.0 / 3.0

    def __post_init__(self) -> None:
        if not self.rho > 0 or not math.isfinite(self.rho):
            raise ConfigError(f"MST's rho must be a finite number > 0, got {self.rho!r}")
        shares = (self.one_way_share, self.selection_share)
        if not all(0.0 < u < 1.0 for u in shares) or sum(shares) >= 1.0:
            raise ConfigError(
                f"mst.one_way_share and mst.selection_share must each be in (0, 1) and leave a share for the "
                f"2-way marginals, got {self.one_way_share!r} and {self.selection_share!r}"
            )
        if self.columns < 2:
            raise ConfigError(f"MST builds a tree of column pairs: it needs at least two columns, got {self.columns}")

    @property
    def rounds(self) -> int:
        """Exponential-mechanism rounds, and 2-way marginals: the spanning tree's edges."""
        return self.columns - 1

    @property
    def phase_rho(self) -> tuple[float, float, float]:
        """(1-way measurements, selection, 2-way measurements): the shares of rho (thirds by default)."""
        one_way, selection = self.one_way_share * self.rho, self.selection_share * self.rho
        return one_way, selection, self.rho - one_way - selection

    @property
    def one_way_std(self) -> float:
        return gaussian_std(self.phase_rho[0] / self.columns)

    @property
    def selection_epsilon(self) -> float:
        """Epsilon of each exponential-mechanism round: rho_round = epsilon^2 / 8."""
        return math.sqrt(8.0 * self.phase_rho[1] / self.rounds)

    @property
    def two_way_std(self) -> float:
        return gaussian_std(self.phase_rho[2] / self.rounds)

    def spent(self) -> float:
        """The rho the mechanisms add up to (equal to `rho` up to rounding): the composition."""
        one_way = self.columns * gaussian_rho(self.one_way_std)
        return one_way + self.rounds * (self.selection_epsilon**2 / 8.0 + gaussian_rho(self.two_way_std))

    def to_dict(self) -> dict:
        return {
            "rho": self.rho,
            "columns": self.columns,
            "phase_rho": list(self.phase_rho),
            "one_way_std": self.one_way_std,
            "selection_epsilon": self.selection_epsilon,
            "two_way_std": self.two_way_std,
            "rho_spent": self.spent(),
        }


class DisjointSet:
    """Components of the forest chosen so far (union-find)."""

    def __init__(self, size: int):
        self.parent = list(range(size))

    def find(self, item: int) -> int:
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


def select_tree(
    scores: dict[tuple[int, int], float], columns: int, epsilon: float, rng: np.random.Generator
) -> list[tuple[int, int]]:
    """`columns - 1` exponential-mechanism rounds, each over the pairs that join two components of the
    forest chosen so far: a spanning tree (Kruskal's algorithm with private choices)."""
    pairs = sorted(scores)
    values = np.array([scores[p] for p in pairs], dtype=np.float64)
    components = DisjointSet(columns)
    chosen: list[tuple[int, int]] = []
    for _ in range(columns - 1):
        candidates = np.flatnonzero([components.find(a) != components.find(b) for a, b in pairs])
        a, b = pairs[int(candidates[exponential_mechanism(values[candidates], epsilon, rng)])]
        components.union(a, b)
        chosen.append((a, b))
    return chosen
