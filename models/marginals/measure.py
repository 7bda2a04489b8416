"""Measured marginals: counts of the training rows over public cells, released by the Gaussian mechanism.

A marginal is a tuple of column names; its counts are a histogram over the product of the columns' cells
(`dpsynth.models.data.binning`: declared levels, or bins of the public bounds plus declared point masses), flattened
row-major. A row whose value is missing or undeclared in any of the marginal's columns is counted in no
cell: its absence can only lower a count change, never raise it.

Adjacency is REPLACE-ONE (dpsynth's unit of privacy: one row replaced by any other, the size fixed).
Replacing a row takes one count from one cell and gives one to another in every marginal, so a
marginal's count vector moves by at most L1 2 and L2 sqrt(2) (`L2_SENSITIVITY`); a row counted in no
cell moves it by 1 at most. `tests/models/test_marginals.py` checks this by brute force.

The Gaussian mechanism, in the project's noise-multiplier convention: a marginal measured at noise
multiplier sigma gets N(0, (sigma x sqrt(2))^2) added to each cell, i.e. noise std = sigma times the
L2 sensitivity. Its zCDP is rho = Delta^2 / (2 std^2) = 1 / (2 sigma^2), and its RDP at order a is
a rho (exact for the Gaussian mechanism). The noise comes from the run's secret (`PrivacySecret.numpy`,
purpose "marginals"), never from a public seed. Each draw is rounded to an integer before it is added
(post-processing of the draw): the published count is the count plus an integer, so the floating-point
bits of numpy's sampler (docs/privacy.md section 4) do not reach the release, which holds these counts
as they are. The rounding adds variance 1/12 and no privacy cost.

Workload: the 1-way marginal of every column and the 2-way marginal of every column with the target
(`fixed_workload`), then, optionally, `selections` more pairs chosen privately as AIM does: each round
is an exponential mechanism (Gumbel-max) over the pairs not yet measured, scoring a pair by the L1
distance between its real 2-way counts and the estimate that the noisy measurements so far give it
(the outer product of their 1-way shares times their total), minus the expected L1 error its own
measurement would have (public). The estimate is a function of earlier noisy outputs only, so under
replace-one the score moves by at most the L1 change of the real counts: 2 (`SCORE_SENSITIVITY`).
The exponential mechanism exp(epsilon u / (2 x 2)) is epsilon-DP and epsilon-bounded-range, hence
epsilon^2 / 8 zCDP (Cesar and Rogers 2021); each selected pair is then measured like the others.

The whole measurement's cost (`MeasurementPlan`) is public before any row is read: rho is the sum of
the marginals' and the selection rounds', the RDP curve a rho, and (epsilon, delta) comes from the
project's RDP conversion (`dpsynth.models.privacy.dpsgd_accountant`). `adjacency="add/remove-one"` gives the curve under
add/remove (sensitivity 1: rho = 1 / (4 sigma^2), selection (epsilon/2)^2 / 8) for composing with the
DP-SGD accountant's add/remove curves.

Shapes: a declared share of rho (`shape_share`) measures every continuous column's fine 1-way histogram
(dpsynth.models.marginals.shapes, the same Gaussian mechanism and sensitivity, noise purpose
"<purpose>-shapes"); the calibration places every value inside its cell by them.

Everything after the noise is post-processing (`consistent_shares`): one total, non-negative counts,
marginals that agree on every column they share. Only noisy values leave this module.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dpsynth.models.data.binning import DEFAULT_BINS, cell_count, frame_cells
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError
from dpsynth.models.privacy.checks import is_int, is_real
from dpsynth.models.privacy.secret import PrivacySecret

if TYPE_CHECKING:
    from dpsynth.models.marginals.shapes import ColumnShapes

Marginal = tuple[str, ...]

L1_SENSITIVITY = 2.0
L2_SENSITIVITY = math.sqrt(2.0)
SCORE_SENSITIVITY = 2.0
ADJACENCIES = ("replace-one", "add/remove-one")
MECHANISM = (
    "Gaussian mechanism on marginal counts (noise std = noise multiplier x sqrt(2), replace-one "
    "L2 sensitivity sqrt(2)), pairs selected by the exponential mechanism (score sensitivity 2, "
    "epsilon^2/8 zCDP per round); RDP a x rho"
)
NOISE_PURPOSE = "marginals"
# IPF stops when every margin is within this share of the total, or after this many sweeps.
_IPF_TOLERANCE = 1e-10
_IPF_SWEEPS = 1000
# A tiny share of the independence estimate added before IPF, so that every cell whose margins are
# positive can be reached (IPF cannot move mass into a slice that is all zero).
_SEED_MASS = 1e-9


# ------------------------------------------------------------------------------------------- cells


def fixed_workload(schema: DatasetSchema) -> tuple[Marginal, ...]:
    """The marginals every measurement takes: each column alone, then each other column with the target."""
    names = schema.column_names
    return tuple((name,) for name in names) + tuple((name, schema.target) for name in names if name != schema.target)


def candidate_pairs(schema: DatasetSchema, taken: Iterable[Marginal]) -> list[Marginal]:
    """The pairs of columns (schema order) that `taken` does not already measure, in either order."""
    measured = {frozenset(m) for m in taken if len(m) == 2}
    return [pair for pair in itertools.combinations(schema.column_names, 2) if frozenset(pair) not in measured]


def marginal_shape(schema: DatasetSchema, marginal: Marginal, bins: int = DEFAULT_BINS) -> tuple[int, ...]:
    """Cells per column of the marginal."""
    return tuple(cell_count(schema.column(name), bins) for name in marginal)


def flat_cells(codes: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Each row's cell of a marginal, from its cell codes in the marginal's columns (rows x k): the
    row-major index into the product of the columns' cells, -1 where any code is missing."""
    codes = np.asarray(codes, dtype=np.int64).reshape(len(codes), len(shape))
    missing = (codes < 0).any(axis=1)
    flat = np.ravel_multi_index(tuple(np.where(missing, 0, codes[:, j]) for j in range(len(shape))), shape)
    return np.where(missing, -1, flat)


def counts_of_cells(flat: np.ndarray, size: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Histogram (float64) of flat cell indices; rows at -1 are in no cell."""
    keep = flat >= 0
    return np.bincount(flat[keep], weights=None if weights is None else weights[keep], minlength=size).astype(
        np.float64
    )


def frame_codes(
    schema: DatasetSchema, frame: pd.DataFrame, names: Sequence[str], bins: int = DEFAULT_BINS
) -> dict[str, np.ndarray]:
    """Each row's cell code in each named column (binning's cells)."""
    missing = [name for name in names if name not in frame.columns]
    if missing:
        raise ConfigError(f"the table has no column {missing[0]!r}, which a measured marginal needs")
    columns = [schema.column(name) for name in names]
    cells = frame_cells(columns, frame, bins)
    return {name: cells[:, j] for j, name in enumerate(names)}


def marginal_counts(
    frame: pd.DataFrame, schema: DatasetSchema, marginal: Marginal, bins: int = DEFAULT_BINS
) -> np.ndarray:
    """The marginal's counts on `frame` (float64, flat, row-major), rows with a missing cell in none."""
    codes = frame_codes(schema, frame, marginal, bins)
    return _counts(codes, marginal, marginal_shape(schema, marginal, bins))


def _counts(codes: dict[str, np.ndarray], marginal: Marginal, shape: tuple[int, ...]) -> np.ndarray:
    stacked = np.stack([codes[name] for name in marginal], axis=1)
    return counts_of_cells(flat_cells(stacked, shape), math.prod(shape))


# ----------------------------------------------------------------------------------------- cost


def rho_of(noise_multiplier: float, adjacency: str = "replace-one") -> float:
    """zCDP of one marginal at this noise multiplier: Delta^2 / (2 std^2), std = sigma sqrt(2); Delta is
    sqrt(2) under replace-one, 1 under add/remove-one."""
    sensitivity = L2_SENSITIVITY if _check_adjacency(adjacency) == "replace-one" else 1.0
    std = noise_multiplier * L2_SENSITIVITY
    return sensitivity**2 / (2.0 * std**2)


def noise_multiplier_for(rho: float) -> float:
    """The noise multiplier whose replace-one zCDP is `rho`."""
    return 1.0 / math.sqrt(2.0 * rho)


def selection_rho(epsilon: float, adjacency: str = "replace-one") -> float:
    """zCDP of one exponential-mechanism round calibrated to score sensitivity 2 at `epsilon`: it is
    epsilon-bounded-range under replace-one (rho = epsilon^2 / 8) and, since one row added or removed
    moves the score by 1 only, epsilon/2-bounded-range under add/remove-one."""
    scale = 1.0 if _check_adjacency(adjacency) == "replace-one" else 0.5
    return (scale * epsilon) ** 2 / 8.0


def epsilon_of_rho(
    rho: float, delta: float, conversion: str = "classic", orders: Iterable[float] | None = None
) -> float:
    """(epsilon at `delta`) of a rho-zCDP mechanism by the project's RDP conversion: its RDP at order a is
    a x rho on `orders` (default: dpsynth.models.privacy.dpsgd_accountant.ORDERS), converted "classic" or
    "opacus" (dpsynth.models.privacy.dpsgd_accountant). Rho 0 releases nothing: epsilon 0."""
    from dpsynth.models.privacy.accountant import check_delta
    from dpsynth.models.privacy.dpsgd_accountant import _check_conversion, _check_orders, _convert

    if not is_real(rho) or float(rho) < 0:
        raise ConfigError(f"rho must be a finite number >= 0, got {rho!r}")
    grid = np.asarray(_check_orders(orders), dtype=float)
    d, conv = check_delta(delta), _check_conversion(conversion)
    if float(rho) == 0.0:
        return 0.0
    return _convert(grid, grid * float(rho), d, conv)


def _check_adjacency(adjacency: object) -> str:
    if adjacency not in ADJACENCIES:
        raise ConfigError(f"adjacency must be one of {', '.join(ADJACENCIES)}, got {adjacency!r}")
    return str(adjacency)


def _check_positive(value: object, what: str) -> float:
    if not is_real(value) or float(value) <= 0:
        raise ConfigError(f"{what} must be a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class MeasurementPlan:
    """What a measurement will spend, fixed before any row is read: the fixed marginals with one noise
    multiplier each, and `selections` privately chosen pairs (each an exponential mechanism at
    `selection_epsilon`, then a measurement at `selected_noise_multiplier`)."""

    marginals: tuple[Marginal, ...]
    noise_multipliers: tuple[float, ...]
    selections: int = 0
    selection_epsilon: float = 0.0
    selected_noise_multiplier: float = 1.0
    bins: int = DEFAULT_BINS
    # The continuous columns whose fine histograms are measured, each at `shape_noise_multiplier`.
    shape_columns: tuple[str, ...] = ()
    shape_noise_multiplier: float = 1.0

    def __post_init__(self) -> None:
        marginals = tuple(tuple(str(name) for name in m) for m in self.marginals)
        if not marginals or any(not m or len(set(m)) != len(m) for m in marginals):
            raise ConfigError(f"a plan measures at least one marginal of distinct columns, got {self.marginals!r}")
        if len(self.noise_multipliers) != len(marginals):
            raise ConfigError(
                f"one noise multiplier per marginal: {len(marginals)} marginals, "
                f"{len(self.noise_multipliers)} noise multipliers"
            )
        object.__setattr__(self, "marginals", marginals)
        object.__setattr__(
            self,
            "noise_multipliers",
            tuple(_check_positive(s, "a marginal's noise multiplier") for s in self.noise_multipliers),
        )
        if not is_int(self.selections) or self.selections < 0:
            raise ConfigError(f"the number of selected pairs must be an integer >= 0, got {self.selections!r}")
        if self.selections:
            _check_positive(self.selection_epsilon, "the selection epsilon")
            _check_positive(self.selected_noise_multiplier, "the selected pairs' noise multiplier")
        if not is_int(self.bins) or self.bins < 1:
            raise ConfigError(f"bins must be an integer >= 1, got {self.bins!r}")
        object.__setattr__(self, "shape_columns", tuple(str(name) for name in self.shape_columns))
        if self.shape_columns:
            _check_positive(self.shape_noise_multiplier, "the shapes' noise multiplier")

    def rho(self, adjacency: str = "replace-one") -> float:
        """zCDP of the whole measurement: the marginals', the shapes' and the selection rounds' added."""
        fixed = sum(rho_of(s, adjacency) for s in self.noise_multipliers)
        fixed += len(self.shape_columns) * rho_of(self.shape_noise_multiplier, adjacency) if self.shape_columns else 0.0
        if not self.selections:
            return fixed
        per_round = selection_rho(self.selection_epsilon, adjacency) + rho_of(self.selected_noise_multiplier, adjacency)
        return fixed + self.selections * per_round

    def rdp(self, orders: Iterable[float] | None = None, adjacency: str = "replace-one") -> np.ndarray:
        """RDP at each order (default: dpsynth.models.privacy.dpsgd_accountant.ORDERS): a x rho, to add order by
        order to a
        training curve of the same adjacency."""
        from dpsynth.models.privacy.dpsgd_accountant import (
            _check_orders,  # the accountant only where a cost is asked
        )

        return np.asarray(_check_orders(orders), dtype=float) * self.rho(adjacency)

    def epsilon(
        self,
        delta: float,
        conversion: str = "classic",
        orders: Iterable[float] | None = None,
        adjacency: str = "replace-one",
    ) -> float:
        """(epsilon at `delta`) of the measurement alone, by the project's RDP conversion."""
        return epsilon_of_rho(self.rho(adjacency), delta, conversion, orders)

    def noise_std(self, index: int) -> float:
        """The noise std of the fixed marginal at `index`."""
        return self.noise_multipliers[index] * L2_SENSITIVITY

    def to_dict(self) -> dict:
        raw = asdict(self)
        raw["marginals"] = [list(m) for m in self.marginals]
        raw["noise_multipliers"] = list(self.noise_multipliers)
        raw["shape_columns"] = list(self.shape_columns)
        return raw

    @classmethod
    def from_dict(cls, raw: dict) -> MeasurementPlan:
        keys = {
            "marginals",
            "noise_multipliers",
            "selections",
            "selection_epsilon",
            "selected_noise_multiplier",
            "bins",
        }
        shape_keys = {"shape_columns", "shape_noise_multiplier"}  # absent from plans made before shapes
        if not isinstance(raw, dict) or set(raw) not in (keys, keys | shape_keys):
            raise ConfigError(f"a measurement plan has exactly the keys {sorted(keys | shape_keys)}, got {raw!r}")
        return cls(
            tuple(tuple(m) for m in raw["marginals"]),
            tuple(raw["noise_multipliers"]),
            raw["selections"],
            raw["selection_epsilon"],
            raw["selected_noise_multiplier"],
            raw["bins"],
            tuple(raw.get("shape_columns", ())),
            raw.get("shape_noise_multiplier", 1.0),
        )


def plan_for_rho(
    schema: DatasetSchema,
    rho: float,
    selections: int = 0,
    selection_share: float = 0.1,
    bins: int = DEFAULT_BINS,
    shape_share: float = 0.0,
) -> MeasurementPlan:
    """The plan spending `rho` (zCDP, replace-one): `selection_share` of it on the selection rounds (equal
    epsilon per round), `shape_share` on the continuous columns' fine histograms (equal rho per column;
    none without a continuous column), the rest in equal shares to every measured marginal, fixed or
    selected (equal rho per marginal, as MST and AIM do within a round)."""
    rho = _check_positive(rho, "rho")
    if selections and not 0 < selection_share < 1:
        raise ConfigError(f"the selection share must be in (0, 1), got {selection_share!r}")
    shape_columns = tuple(c.name for c in schema.columns if c.is_continuous) if shape_share else ()
    spent_on_selection = selection_share * rho if selections else 0.0
    spent_on_shapes = shape_share * rho if shape_columns else 0.0
    if not 0 <= shape_share < 1 or spent_on_selection + spent_on_shapes >= rho:
        raise ConfigError(
            f"the shape share ({shape_share!r}) and the selection share ({selection_share!r}) must leave rho "
            "for the marginals: each in [0, 1), together below 1"
        )
    fixed = fixed_workload(schema)
    sigma = noise_multiplier_for((rho - spent_on_selection - spent_on_shapes) / (len(fixed) + selections))
    epsilon = math.sqrt(8.0 * spent_on_selection / selections) if selections else 0.0
    shape_sigma = noise_multiplier_for(spent_on_shapes / len(shape_columns)) if shape_columns else 1.0
    return MeasurementPlan(fixed, (sigma,) * len(fixed), selections, epsilon, sigma, bins, shape_columns, shape_sigma)


def plan_for_epsilon(
    schema: DatasetSchema,
    epsilon: float,
    delta: float,
    selections: int = 0,
    selection_share: float = 0.1,
    conversion: str = "classic",
    bins: int = DEFAULT_BINS,
) -> MeasurementPlan:
    """The plan of `plan_for_rho` with the largest rho whose (epsilon, delta) stays within `epsilon`
    (bisection on log rho; the conversion is increasing in rho)."""
    target = _check_positive(epsilon, "epsilon")
    low, high = math.log(1e-12), math.log(1e4)
    for _ in range(100):
        mid = (low + high) / 2.0
        plan = plan_for_rho(schema, math.exp(mid), selections, selection_share, bins)
        if plan.epsilon(delta, conversion) <= target:
            low = mid
        else:
            high = mid
    plan = plan_for_rho(schema, math.exp(low), selections, selection_share, bins)
    if plan.epsilon(delta, conversion) > target:
        raise ConfigError(f"no measurement fits epsilon {target!r} at delta {delta!r}")
    return plan


# ------------------------------------------------------------------------------------ measurement


@dataclass(frozen=True)
class MeasuredMarginal:
    """One marginal as released: its noisy counts (the Gaussian mechanism's output, flat, row-major) and
    the consistent shares post-processed from all measurements. No real count is kept."""

    columns: tuple[str, ...]
    shape: tuple[int, ...]
    noise_multiplier: float
    noisy_counts: tuple[float, ...]
    shares: tuple[float, ...]
    selected: bool = False

    @property
    def noise_std(self) -> float:
        return self.noise_multiplier * L2_SENSITIVITY

    def table(self) -> np.ndarray:
        """The consistent shares as an array of `shape`."""
        return np.asarray(self.shares, dtype=np.float64).reshape(self.shape)

    def to_dict(self) -> dict:
        return {
            "columns": list(self.columns),
            "shape": list(self.shape),
            "noise_multiplier": float(self.noise_multiplier),
            "noisy_counts": [float(v) for v in self.noisy_counts],
            "shares": [float(v) for v in self.shares],
            "selected": bool(self.selected),
        }

    @classmethod
    def from_dict(cls, raw: dict) -> MeasuredMarginal:
        keys = {"columns", "shape", "noise_multiplier", "noisy_counts", "shares", "selected"}
        if not isinstance(raw, dict) or set(raw) != keys:
            raise ConfigError(f"a measured marginal has exactly the keys {sorted(keys)}, got {sorted(raw)!r}")
        shape = tuple(int(n) for n in raw["shape"])
        if (
            len(shape) != len(raw["columns"])
            or len(raw["noisy_counts"]) != math.prod(shape)
            or len(raw["shares"]) != math.prod(shape)
        ):
            raise ConfigError(f"measured marginal {raw['columns']!r}: its counts do not fit its shape {shape}")
        return cls(
            tuple(str(c) for c in raw["columns"]),
            shape,
            float(raw["noise_multiplier"]),
            tuple(float(v) for v in raw["noisy_counts"]),
            tuple(float(v) for v in raw["shares"]),
            bool(raw["selected"]),
        )


@dataclass(frozen=True)
class MeasuredMarginals:
    """A release's measured marginals: noisy counts, consistent shares, the noisy total and the plan
    (the cost). JSON-serialisable through `to_dict`."""

    marginals: tuple[MeasuredMarginal, ...]
    total: float
    plan: MeasurementPlan
    bins: int = DEFAULT_BINS
    mechanism: str = field(default=MECHANISM)
    # The continuous columns' noisy fine histograms (plan.shape_columns), or None.
    shapes: ColumnShapes | None = None

    def get(self, columns: Sequence[str]) -> MeasuredMarginal:
        for marginal in self.marginals:
            if marginal.columns == tuple(columns):
                return marginal
        raise KeyError(tuple(columns))

    @property
    def columns(self) -> list[str]:
        """Every column some marginal measures, in order of first appearance."""
        return list(dict.fromkeys(name for m in self.marginals for name in m.columns))

    def one_way(self, column: str) -> np.ndarray:
        """The column's consistent 1-way shares (every marginal holding it agrees on them)."""
        for marginal in self.marginals:
            if column in marginal.columns:
                axis = marginal.columns.index(column)
                table = marginal.table()
                return table.sum(axis=tuple(a for a in range(table.ndim) if a != axis))
        raise KeyError(column)

    def to_dict(self) -> dict:
        return {
            "mechanism": self.mechanism,
            "bins": int(self.bins),
            "total": float(self.total),
            "plan": self.plan.to_dict(),
            "marginals": [m.to_dict() for m in self.marginals],
            "shapes": None if self.shapes is None else self.shapes.to_dict(),
        }

    @classmethod
    def from_dict(cls, raw: dict) -> MeasuredMarginals:
        from dpsynth.models.marginals.shapes import ColumnShapes

        keys = {"mechanism", "bins", "total", "plan", "marginals"}
        if not isinstance(raw, dict) or set(raw) not in (keys, keys | {"shapes"}):  # no shapes: measured before them
            raise ConfigError(f"measured marginals have exactly the keys {sorted(keys | {'shapes'})}, got {raw!r}")
        shapes = raw.get("shapes")
        return cls(
            tuple(MeasuredMarginal.from_dict(m) for m in raw["marginals"]),
            float(raw["total"]),
            MeasurementPlan.from_dict(raw["plan"]),
            int(raw["bins"]),
            str(raw["mechanism"]),
            None if shapes is None else ColumnShapes.from_dict(shapes),
        )


def measure(
    frame: pd.DataFrame,
    schema: DatasetSchema,
    plan: MeasurementPlan,
    secret: PrivacySecret,
    purpose: str = NOISE_PURPOSE,
) -> MeasuredMarginals:
    """Measure `plan`'s marginals of the training rows `frame` (decoded values): the fixed marginals, then
    the privately selected pairs, each count plus Gaussian noise from the secret's `purpose` stream (the
    selection's Gumbel draws from `purpose`-selection); then the consistent shares of them all; and the
    plan's column shapes (noise from `purpose`-shapes)."""
    from dpsynth.models.marginals.shapes import measure_shapes  # shapes builds on this module

    noise = secret.numpy(purpose)
    names = list(dict.fromkeys([*schema.column_names, *(n for m in plan.marginals for n in m)]))
    codes = frame_codes(schema, frame, names, plan.bins)
    measured: list[tuple[Marginal, float, np.ndarray, bool]] = []
    for marginal, sigma in zip(plan.marginals, plan.noise_multipliers, strict=False):
        measured.append((marginal, sigma, noisy_marginal(codes, schema, marginal, sigma, plan.bins, noise), False))
    if plan.selections:
        chosen = select_pairs(codes, schema, plan, measured, secret.numpy(f"{purpose}-selection"))
        for pair in chosen:
            sigma = plan.selected_noise_multiplier
            measured.append((pair, sigma, noisy_marginal(codes, schema, pair, sigma, plan.bins, noise), True))
    shapes = [marginal_shape(schema, m, plan.bins) for m, *_ in measured]
    shares, total = consistent_shares(
        [m for m, *_ in measured],
        shapes,
        [c for _, _, c, _ in measured],
        [s * L2_SENSITIVITY for _, s, _, _ in measured],
    )
    released = tuple(
        MeasuredMarginal(m, shape, s, tuple(float(v) for v in c), tuple(float(v) for v in p.ravel()), sel)
        for (m, s, c, sel), shape, p in zip(measured, shapes, shares, strict=False)
    )
    column_shapes = None
    if plan.shape_columns:
        columns = [schema.column(name) for name in plan.shape_columns]
        column_shapes = measure_shapes(
            frame, columns, plan.shape_noise_multiplier, secret.numpy(f"{purpose}-shapes"), plan.bins
        )
    return MeasuredMarginals(released, total, plan, plan.bins, shapes=column_shapes)


def noisy_marginal(
    codes: dict[str, np.ndarray],
    schema: DatasetSchema,
    marginal: Marginal,
    sigma: float,
    bins: int,
    noise: np.random.Generator,
) -> np.ndarray:
    """The Gaussian mechanism on one marginal: counts plus N(0, (sigma sqrt(2))^2) per cell, each draw
    rounded to an integer (so the sum is exact and shows nothing of the count but the rounded draw)."""
    counts = _counts(codes, marginal, marginal_shape(schema, marginal, bins))
    return counts + np.rint(noise.normal(0.0, sigma * L2_SENSITIVITY, counts.shape))


def pair_score(counts: np.ndarray, estimate: np.ndarray) -> float:
    """How badly the estimate misses a pair's real counts: their L1 distance. Replace-one moves the
    counts by L1 2 at most and the estimate not at all (it is noisy output), so the score by 2 at most."""
    return float(np.abs(np.asarray(counts, dtype=np.float64) - estimate).sum())


def select_pairs(
    codes: dict[str, np.ndarray],
    schema: DatasetSchema,
    plan: MeasurementPlan,
    measured: Sequence[tuple[Marginal, float, np.ndarray, bool]],
    gumbel: np.random.Generator,
) -> list[Marginal]:
    """`plan.selections` rounds of the exponential mechanism (Gumbel-max) over the pairs not measured
    yet. A pair's utility is its `pair_score` against the outer product of the noisy measurements'
    consistent 1-way shares times their total, minus its own measurement's expected L1 error
    (sqrt(2/pi) std per cell: public), so that a wide pair is not chosen for noise it would add."""
    marginals = [m for m, *_ in measured]
    shapes = [marginal_shape(schema, m, plan.bins) for m in marginals]
    shares, total = consistent_shares(
        marginals, shapes, [c for _, _, c, _ in measured], [s * L2_SENSITIVITY for _, s, _, _ in measured]
    )
    one_way = _one_way_shares(marginals, shares)
    candidates = candidate_pairs(schema, marginals)
    std = plan.selected_noise_multiplier * L2_SENSITIVITY
    utility = np.empty(len(candidates))
    for i, (a, b) in enumerate(candidates):
        estimate = total * np.outer(one_way[a], one_way[b]).ravel()
        counts = _counts(codes, (a, b), marginal_shape(schema, (a, b), plan.bins))
        utility[i] = pair_score(counts, estimate) - math.sqrt(2.0 / math.pi) * std * counts.size
    chosen: list[Marginal] = []
    available = np.ones(len(candidates), dtype=bool)
    for _ in range(min(plan.selections, len(candidates))):
        logits = plan.selection_epsilon * utility / (2.0 * SCORE_SENSITIVITY) + gumbel.gumbel(size=len(candidates))
        pick = int(np.argmax(np.where(available, logits, -np.inf)))
        available[pick] = False
        chosen.append(candidates[pick])
    return chosen


def _one_way_shares(marginals: Sequence[Marginal], shares: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for marginal, table in zip(marginals, shares, strict=False):
        for axis, name in enumerate(marginal):
            out.setdefault(name, table.sum(axis=tuple(a for a in range(table.ndim) if a != axis)))
    return out


# ----------------------------------------------------------------------------- post-processing


def project_to_simplex(values: np.ndarray, total: float) -> np.ndarray:
    """The nearest (Euclidean) vector with entries >= 0 summing to `total` (sort-based projection)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    ordered = np.sort(v)[::-1]
    excess = np.cumsum(ordered) - total
    ranks = np.arange(1, len(v) + 1)
    last = np.nonzero(ordered - excess / ranks > 0)[0][-1]
    return np.maximum(v - excess[last] / (last + 1), 0.0).reshape(np.shape(values))


def consistent_shares(
    marginals: Sequence[Marginal], shapes: Sequence[tuple[int, ...]], noisy: Sequence[np.ndarray], stds: Sequence[float]
) -> tuple[list[np.ndarray], float]:
    """Post-processing of noisy counts into one consistent estimate. Returns each marginal's shares (an
    array of its shape) and the estimated total. Enforced exactly (up to IPF's tolerance):

    * one total: the inverse-variance weighted mean of the marginals' noisy sums (at least 1);
    * each column's 1-way estimate: the inverse-variance weighted mean of every measurement of it (its
      1-way marginal, the margins of the marginals holding it), projected onto the non-negative counts
      summing to the total;
    * each marginal of k >= 2 columns: its noisy table projected the same way, then fitted by IPF to the
      1-way estimates of its columns, so all marginals sharing a column agree on it.

    Not enforced: agreement on shared sub-marginals of two or more columns (none exist with the pairs
    measured here). Shares are the counts divided by the total: non-negative, each marginal summing to 1.
    """
    tables = [np.asarray(c, dtype=np.float64).reshape(s) for c, s in zip(noisy, shapes, strict=False)]
    total = _estimated_total(tables, stds)
    one_way = _combined_one_way(marginals, tables, stds, total)
    shares = []
    for marginal, table in zip(marginals, tables, strict=False):
        if len(marginal) == 1:
            shares.append(one_way[marginal[0]] / total)
            continue
        targets = [one_way[name] for name in marginal]
        shares.append(_ipf(project_to_simplex(table, total), targets, total) / total)
    return shares, total


def _estimated_total(tables: Sequence[np.ndarray], stds: Sequence[float]) -> float:
    """Each noisy sum has variance cells x std^2: their inverse-variance weighted mean."""
    weights = np.array([1.0 / (t.size * s * s) for t, s in zip(tables, stds, strict=False)])
    sums = np.array([t.sum() for t in tables])
    return max(float((weights * sums).sum() / weights.sum()), 1.0)


def _combined_one_way(
    marginals: Sequence[Marginal], tables: Sequence[np.ndarray], stds: Sequence[float], total: float
) -> dict[str, np.ndarray]:
    """Per column, every measurement's margin on it weighted by the inverse of its per-cell variance
    (std^2 times the cells summed into each), then projected onto the counts summing to `total`."""
    sums: dict[str, np.ndarray] = {}
    weights: dict[str, float] = {}
    for marginal, table, std in zip(marginals, tables, stds, strict=False):
        for axis, name in enumerate(marginal):
            margin = table.sum(axis=tuple(a for a in range(table.ndim) if a != axis))
            weight = 1.0 / (std * std * (table.size // table.shape[axis]))
            sums[name] = sums.get(name, 0.0) + weight * margin
            weights[name] = weights.get(name, 0.0) + weight
    return {name: project_to_simplex(sums[name] / weights[name], total) for name in sums}


def _ipf(table: np.ndarray, targets: Sequence[np.ndarray], total: float) -> np.ndarray:
    """Iterative proportional fitting of a non-negative table to 1-way margins that share its total.
    A tiny share of the independence table is added first so that every cell with positive margins
    can receive mass."""
    independence = targets[0]
    for target in targets[1:]:
        independence = np.multiply.outer(independence, target / total)
    fitted = table + _SEED_MASS * independence
    for _ in range(_IPF_SWEEPS):
        worst = 0.0
        for axis, target in enumerate(targets):
            others = tuple(a for a in range(fitted.ndim) if a != axis)
            margin = fitted.sum(axis=others)
            worst = max(worst, float(np.abs(margin - target).max()))
            ratio = np.divide(target, margin, out=np.zeros_like(target), where=margin > 0)
            fitted = fitted * np.expand_dims(ratio, others)
        if worst <= _IPF_TOLERANCE * total:
            break
    return fitted


__all__ = [
    "ADJACENCIES",
    "L1_SENSITIVITY",
    "L2_SENSITIVITY",
    "MECHANISM",
    "SCORE_SENSITIVITY",
    "Marginal",
    "MeasuredMarginal",
    "MeasuredMarginals",
    "MeasurementPlan",
    "candidate_pairs",
    "consistent_shares",
    "fixed_workload",
    "marginal_counts",
    "marginal_shape",
    "measure",
    "noise_multiplier_for",
    "pair_score",
    "plan_for_epsilon",
    "plan_for_rho",
    "project_to_simplex",
    "rho_of",
    "select_pairs",
    "selection_rho",
]
