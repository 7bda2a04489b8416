"""How AIM spends its zCDP budget under REPLACE-ONE adjacency, round by round.

With rho the whole budget, d columns and T rounds (`rounds`, the paper's 16 d by default):

* every column's 1-way marginal first, by the Gaussian mechanism at std s: a replaced row moves a count
  vector by L2 sqrt(2) (MST's `L2_SENSITIVITY`), so each costs 1 / s^2 (MST's `gaussian_rho`). By default
  (the paper) s is the first rounds' std below; with a declared `one_way_share` u > 0 the d 1-way
  marginals spend u rho together, s1 = sqrt(d / (u rho)), and the rounds below share the rest (1 - u) rho
  in place of rho (at epsilon 1 the first rounds' std leaves the 1-way counts, and so every categorical
  column's level shares, far noisier than MST's, which spends a third of its rho on them). A derived share
  (`one_way_share: auto`, `derived_one_way_share`) is a function of public facts only: rho, d, T, the
  schema's cells and the number of training rows n, which replace-one neighbours share (the estimator's
  known total), so it is fixed before any count is read and composes as a declared one;
* with a declared `numeric_pair_share` u2 > 0 and c >= 2 continuous columns, c - 1 pair rounds follow the
  1-way marginals, before the rounds below: each an exponential-mechanism selection among the pairs of two
  continuous columns (over groups of their cells) at e2 and a Gaussian measurement at s2, with
  e2^2 / 8 = 0.1 u2 rho / (c - 1) and 1 / s2^2 = 0.9 u2 rho / (c - 1): u2 rho together. The rounds
  below then share (1 - u1 - u2) rho. With fewer than two continuous columns nothing is spent on pairs;
* then rounds, each an exponential-mechanism selection at epsilon e (e-bounded-range: e^2 / 8, as MST's
  tree selection) and a Gaussian measurement of the chosen marginal at std s. The first rounds run at
  s = sqrt(2) / sqrt(2 x 0.9 rho / T) and e = sqrt(8 x 0.1 rho / T): T rounds would spend 0.9 rho on
  measurements and 0.1 rho on selections;
* annealing (the mechanism's choice, from noisy outputs only) halves s and doubles e;
* when what is left is less than two rounds at the current scales, the last round takes exactly what is
  left: 0.9 of it for its measurement and 0.1 for its selection (`last_round`).

A selection's score is weight x (L1 error of the model's marginal - sqrt(2 / pi) s x cells): the real
counts enter through the L1 distance only, which a replaced row moves by at most 2, so the score's
sensitivity is 2 x its weight, and the mechanism is calibrated to 2 x the largest weight among the
round's candidates (`score_sensitivity`; the paper's add/remove-one analysis has 1 x the weight). The
weights are public configuration (`aim.numeric_pair_weight` lifts the pairs of continuous columns), so a
larger weight is paid for by every round's calibration, not by a larger rho. A pair measured over groups
of its cells (`aim.numeric_pair_groups`) is a count vector too: a replaced row moves one group's count
down and one up, L2 sqrt(2) for its Gaussian and L1 2 for its score, as a marginal's.

Every scale is a function of rho, T and earlier noisy outputs, so the mechanisms compose adaptively:
their rhos add up to rho (`RhoLedger`), whose RDP at order a is a x rho.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from dpsynth.models.errors import BudgetExceededError, ConfigError
from dpsynth.models.generators.graphical.mechanisms import L2_SENSITIVITY, gaussian_rho, gaussian_std

# Of each round's rho, the share of the selection (the exponential mechanism); the rest measures.
SELECTION_SHARE = 0.1
# Of the score's weight: how far a replaced row moves the L1 distance between two count vectors.
L1_SENSITIVITY = 2.0
# Relative slack of the rho ledger's sum (floating-point rounding of the last round's share).
RHO_TOLERANCE = 1e-9

__all__ = [
    "L1_SENSITIVITY",
    "L2_SENSITIVITY",
    "SELECTION_SHARE",
    "AIMBudget",
    "RhoLedger",
    "derived_one_way_share",
    "last_round",
    "round_rho",
    "score_sensitivity",
    "selection_rho",
]


def selection_rho(epsilon: float) -> float:
    """zCDP of one exponential-mechanism selection at `epsilon` (bounded range): epsilon^2 / 8."""
    return epsilon**2 / 8.0


def round_rho(std: float, epsilon: float) -> float:
    """zCDP of one round: a selection at `epsilon` and a Gaussian measurement at `std`."""
    return selection_rho(epsilon) + gaussian_rho(std)


def last_round(remaining: float) -> tuple[float, float]:
    """(measurement std, selection epsilon) of a round that spends exactly `remaining`."""
    std = gaussian_std((1.0 - SELECTION_SHARE) * remaining)
    return std, math.sqrt(8.0 * SELECTION_SHARE * remaining)


def score_sensitivity(weights: Iterable[float]) -> float:
    """Replace-one sensitivity of the round's scores: 2 x the largest weight among its candidates."""
    return L1_SENSITIVITY * max(abs(float(w)) for w in weights)


@dataclass(frozen=True)
class AIMBudget:
    """AIM's starting scales for `rho` (zCDP, replace-one) on `columns` columns split into `rounds`."""

    rho: float
    columns: int
    rounds: int
    # Share of rho spent on the 1-way marginals together (0: each at the first rounds' std, the paper's).
    one_way_share: float = 0.0
    # Share of rho spent on the pair rounds among the pairs of continuous columns (0: none, the paper's).
    numeric_pair_share: float = 0.0
    # How many columns are continuous (public: the schema's types); pair rounds need two.
    continuous: int = 0

    def __post_init__(self) -> None:
        if not self.rho > 0 or not math.isfinite(self.rho):
            raise ConfigError(f"AIM's rho must be a finite number > 0, got {self.rho!r}")
        if self.columns < 2:
            raise ConfigError(f"AIM measures marginals of column sets: it needs two columns, got {self.columns}")
        if not 0.0 <= self.one_way_share < 1.0:
            raise ConfigError(f"aim.one_way_share must be in [0, 1), got {self.one_way_share!r}")
        if not 0.0 <= self.numeric_pair_share < 1.0 or self.one_way_share + self.numeric_pair_share >= 1.0:
            raise ConfigError(
                f"aim.numeric_pair_share must be in [0, 1) and leave rho for the rounds with aim.one_way_share, "
                f"got {self.numeric_pair_share!r} and {self.one_way_share!r}"
            )
        # The rounds' rho must hold two rounds: 2 rho_r / T <= rho_r.
        if self.one_way_share > 0 and self.rounds < 2:
            raise ConfigError(f"aim.rounds {self.rounds} is too few: at least two rounds follow the 1-way marginals")
        # The 1-way marginals and two rounds must fit: d x 0.9 rho / T + 2 rho / T <= rho.
        if self.one_way_share == 0 and self.rounds < (1.0 - SELECTION_SHARE) * self.columns + 2.0:
            raise ConfigError(
                f"aim.rounds {self.rounds} is too few for {self.columns} columns: the 1-way marginals and two "
                f"rounds would spend more than rho (at least {math.ceil(0.9 * self.columns + 2)} rounds)."
            )

    @property
    def pair_rounds(self) -> int:
        """How many pair rounds run before the rounds: one per edge of a tree over the continuous columns."""
        return self.continuous - 1 if self.numeric_pair_share > 0 and self.continuous >= 2 else 0

    @property
    def pair_rho(self) -> float:
        """The rho the pair rounds spend together (0 without them)."""
        return self.numeric_pair_share * self.rho if self.pair_rounds else 0.0

    @property
    def pair_std(self) -> float:
        """Noise std of each pair round's measurement."""
        return gaussian_std((1.0 - SELECTION_SHARE) * self.pair_rho / self.pair_rounds)

    @property
    def pair_epsilon(self) -> float:
        """Epsilon of each pair round's selection."""
        return math.sqrt(8.0 * SELECTION_SHARE * self.pair_rho / self.pair_rounds)

    @property
    def rounds_rho(self) -> float:
        """The rho the T rounds are planned on: all of it, or what the 1-way share and the pair rounds leave."""
        return (1.0 - self.one_way_share) * self.rho - self.pair_rho

    @property
    def initial_std(self) -> float:
        """Noise std of the first rounds' measurements (and of the 1-way marginals at share 0)."""
        return gaussian_std((1.0 - SELECTION_SHARE) * self.rounds_rho / self.rounds)

    @property
    def one_way_std(self) -> float:
        """Noise std of each 1-way marginal: d of them spend `one_way_share` of rho (at share 0, `initial_std`)."""
        if self.one_way_share == 0:
            return self.initial_std
        return gaussian_std(self.one_way_share * self.rho / self.columns)

    @property
    def initial_epsilon(self) -> float:
        """Epsilon of the first rounds' selections."""
        return math.sqrt(8.0 * SELECTION_SHARE * self.rounds_rho / self.rounds)

    def to_dict(self) -> dict:
        return {
            "rho": self.rho,
            "columns": self.columns,
            "rounds": self.rounds,
            "one_way_share": self.one_way_share,
            "one_way_std": self.one_way_std,
            "numeric_pair_share": self.numeric_pair_share,
            "pair_rounds": self.pair_rounds,
            "initial_std": self.initial_std,
            "initial_epsilon": self.initial_epsilon,
        } | ({"pair_std": self.pair_std, "pair_epsilon": self.pair_epsilon} if self.pair_rounds else {})


def derived_one_way_share(paper: AIMBudget, rows: int, largest_cells: int, noise_fraction: float, cap: float) -> float:
    """The 1-way share that brings each 1-way marginal's noise std to at most `noise_fraction` of the
    expected count of a cell of the column with the most cells (`largest_cells`, the n `rows` spread
    evenly: public, no count is read), 0 when the paper's std (`paper`, the budget at share 0) already is,
    and at most `cap`. d marginals at std s spend d / s^2, so the share is d / (rho s^2) at the target s.
    A share that would measure them no more precisely than the paper's std (a cap below what the paper
    spends on them) is 0 as well: the paper's split then serves the 1-way marginals and the rounds better."""
    if rows < 1 or largest_cells < 1:
        raise ConfigError(f"a derived 1-way share needs rows and cells, got {rows} rows and {largest_cells} cells")
    target = noise_fraction * rows / largest_cells
    if paper.one_way_std <= target:
        return 0.0
    share = min(cap, paper.columns / (paper.rho * target**2))
    return share if share * paper.rho > paper.columns / paper.one_way_std**2 else 0.0


@dataclass
class RhoLedger:
    """Every mechanism AIM ran, in order, with its zCDP: ("measure", clique, std, rho) or ("select",
    clique chosen, epsilon, rho). It refuses a spend past `rho`."""

    rho: float
    entries: list[dict] = field(default_factory=list)

    @property
    def spent(self) -> float:
        return math.fsum(e["rho"] for e in self.entries)

    @property
    def remaining(self) -> float:
        return self.rho - self.spent

    def measure(self, clique: tuple[int, ...], std: float) -> None:
        self._add({"kind": "measure", "clique": list(clique), "std": std, "rho": gaussian_rho(std)})

    def select(self, clique: tuple[int, ...], epsilon: float, sensitivity: float) -> None:
        entry = {"kind": "select", "clique": list(clique), "epsilon": epsilon, "sensitivity": sensitivity}
        self._add(entry | {"rho": selection_rho(epsilon)})

    def _add(self, entry: dict) -> None:
        if self.spent + entry["rho"] > self.rho * (1.0 + RHO_TOLERANCE):
            raise BudgetExceededError(
                f"AIM would spend rho {self.spent + entry['rho']:.6g}, past its budget {self.rho:.6g}"
            )
        self.entries.append(entry)
