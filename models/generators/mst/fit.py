"""Fitting MST on a decoded table: the measurements (models/generators/mst/privacy.py says what each
costs), then private-pgm's (`mbi`) estimate of a graphical model from the noisy marginals.

1. Every column's 1-way marginal over its public cells (dpsynth.models.data.binning), Gaussian at s1.
2. MST's domain reduction (post-processing of step 1): a column keeps the cells that can hold a value
   (`binning.writable_cells`) whose noisy count is at least `SUPPORT_THRESHOLD` s1; its other writable
   cells become one "other" code, whose measurement is their noisy sum times 1 / sqrt(m) (and its query
   the same weight), so that its noise std stays s1.
3. A spanning tree of column pairs by d - 1 exponential-mechanism rounds (`privacy.select_tree`), a pair
   scored by the L1 distance between its real counts over reduced codes and their estimate from the
   noisy 1-way marginals alone (`one_way_estimate`: what `mbi` gives a model of 1-way cliques).
4. The chosen pairs' 2-way marginals over reduced codes, Gaussian at s2.
5. `mbi`'s mirror descent on every noisy measurement, with the number of rows as the known total (public
   under replace-one adjacency); the junction tree's clique marginals become the released model
   (models/generators/graphical/model.py), normalised.

The noise of each phase comes from its own stream (`noise(purpose)`: the run's `PrivacySecret.numpy`).
jax and `mbi` are imported inside `estimate` only, through `jax_runtime.load_jax` (64-bit floats, no
compilation cache, absl's log handler kept off any redirected stderr).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpsynth.models.data.binning import writable_cells
from dpsynth.models.data.cell_counts import CellCounts, count_frame, one_and_two_way
from dpsynth.models.data.schema import Column
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.graphical.jax_runtime import load_jax
from dpsynth.models.generators.graphical.mechanisms import gaussian_counts
from dpsynth.models.generators.graphical.model import MSTModel, released_cliques
from dpsynth.models.generators.mst.privacy import MSTBudget, select_tree

# MST's domain reduction threshold, in noise standard deviations of the 1-way measurements.
SUPPORT_THRESHOLD = 3.0
# The purposes of the run secret's noise streams, one per phase.
ONE_WAY_NOISE, SELECTION_NOISE, TWO_WAY_NOISE = "mst-one-way", "mst-selection", "mst-two-way"
# The shares of rho for the 1-way marginals and the selection (the 2-way marginals take the rest): MST's thirds.
DEFAULT_SHARES = (1.0 / 3.0, 1.0 / 3.0)

Noise = Callable[[str], np.random.Generator]


@dataclass(frozen=True)
class OneWay:
    """A column's noisy 1-way measurement on its reduced codes: values `y`, query weights `w`."""

    mapping: np.ndarray  # cell -> reduced code (-1: a cell that cannot be written)
    y: np.ndarray
    w: np.ndarray


@dataclass(frozen=True)
class Fitted:
    model: MSTModel
    info: dict  # DP outputs and public facts: the tree, the reduced sizes, the budget
    loss: float  # the estimator's final loss on the noisy measurements (internal)
    seconds: dict


@dataclass(frozen=True)
class Measured:
    """Everything MST's private steps release (steps 1-4), before the estimate: the budget, each column's
    noisy 1-way measurement on its reduced codes, the tree the selection chose, and each chosen pair's noisy
    2-way counts. `estimate` (and so the released model) is post-processing of these alone."""

    budget: MSTBudget
    one_way: list[OneWay]
    tree: list[tuple[int, int]]
    two_way: list[tuple[tuple[int, int], np.ndarray]]

    @property
    def sizes(self) -> list[int]:
        return [len(m.y) for m in self.one_way]


def measure(
    table: pd.DataFrame,
    columns: Sequence[Column],
    rho: float,
    noise: Noise,
    bins: int,
    noise_penalty: bool = False,
    shares: tuple[float, float] = DEFAULT_SHARES,
) -> Measured:
    """MST's private steps (1-4 above) at zCDP `rho` (replace-one) on `table`'s `columns`, every value
    already in a cell (imputed); `noise_penalty` and `shares` as in `fit`."""
    columns = tuple(columns)
    if len(table) < 1:
        raise ConfigError("MST needs at least one training row")
    MSTBudget(float(rho), len(columns), *shares)  # a bad rho is refused before the rows are read
    counts = count_frame(table, columns, bins, one_and_two_way(len(columns)), reader="MST")
    return measure_counts(counts, columns, rho, noise, bins, noise_penalty, shares)


def measure_counts(
    counts: CellCounts,
    columns: Sequence[Column],
    rho: float,
    noise: Noise,
    bins: int,
    noise_penalty: bool = False,
    shares: tuple[float, float] = DEFAULT_SHARES,
) -> Measured:
    """`measure` on the training rows' exact cell counts (every column and every pair: `one_and_two_way`),
    however they were counted: the rows themselves are never read here, and the noise is drawn from
    `noise` after the counts are complete, so one process or a cluster's workers counting the same rows
    release the same numbers."""
    columns = tuple(columns)
    n = counts.total
    if n < 1:
        raise ConfigError("MST needs at least one training row")
    budget = MSTBudget(float(rho), len(columns), *shares)

    rng, s1 = noise(ONE_WAY_NOISE), budget.one_way_std
    one_way = [
        reduce_domain(gaussian_counts(counts.cliques[(j,)], s1, rng), col, bins, s1) for j, col in enumerate(columns)
    ]
    maps = [m.mapping for m in one_way]
    sizes = [len(m.y) for m in one_way]

    def joint(a: int, b: int) -> np.ndarray:
        return counts.mapped((a, b), maps, sizes).astype(np.float64)

    level_shares = [one_way_estimate(m.y, m.w, float(n)) / n for m in one_way]
    scores = scores_of_pairs(joint, n, len(columns), level_shares, budget.two_way_std if noise_penalty else 0.0)
    tree = select_tree(scores, len(columns), budget.selection_epsilon, noise(SELECTION_NOISE))
    rng = noise(TWO_WAY_NOISE)
    two_way = [((a, b), gaussian_counts(joint(a, b), budget.two_way_std, rng)) for a, b in tree]
    return Measured(budget, one_way, tree, two_way)


def fit(
    table: pd.DataFrame,
    columns: Sequence[Column],
    rho: float,
    noise: Noise,
    bins: int,
    iterations: int,
    noise_penalty: bool = False,
    shares: tuple[float, float] = DEFAULT_SHARES,
) -> Fitted:
    """MST at zCDP `rho` (replace-one) on `table`'s `columns`, every value already in a cell (imputed):
    `measure`, then `estimate` from its outputs alone.

    `noise_penalty` (not MST's): each pair's score less sqrt(2 / pi) s2 times its cells, the expected L1
    error its own measurement would add (public, so the score's sensitivity stays 2). `shares`: the shares
    of rho for the 1-way marginals and the selection (`MSTBudget`; thirds by default)."""
    started = time.perf_counter()
    columns = tuple(columns)
    released = measure(table, columns, rho, noise, bins, noise_penalty, shares)
    return _estimated(released, columns, bins, len(table), iterations, started)


def fit_counts(
    counts: CellCounts,
    columns: Sequence[Column],
    rho: float,
    noise: Noise,
    bins: int,
    iterations: int,
    noise_penalty: bool = False,
    shares: tuple[float, float] = DEFAULT_SHARES,
) -> Fitted:
    """`fit` on the training rows' exact cell counts (`measure_counts`)."""
    started = time.perf_counter()
    columns = tuple(columns)
    released = measure_counts(counts, columns, rho, noise, bins, noise_penalty, shares)
    return _estimated(released, columns, bins, counts.total, iterations, started)


def _estimated(
    released: Measured, columns: tuple[Column, ...], bins: int, total: int, iterations: int, started: float
) -> Fitted:
    measured = time.perf_counter()
    sizes = released.sizes
    cliques, tables, parents, loss = estimate(
        sizes, released.one_way, released.budget, released.two_way, total, iterations
    )
    info = {
        "budget": released.budget.to_dict(),
        "reduced_sizes": sizes,
        "tree": [[columns[a].name, columns[b].name] for a, b in released.tree],
    }
    model = MSTModel(columns, bins, [m.mapping for m in released.one_way], cliques, tables, parents)
    model.couple()  # the continuous pairs' copula from the model's own tables: post-processing, no row read
    seconds = {"measure_select": measured - started, "estimate": time.perf_counter() - measured}
    return Fitted(model, info, loss, seconds)


def reduce_domain(noisy: np.ndarray, col: Column, bins: int, std: float) -> OneWay:
    """MST's domain reduction of one column from its noisy 1-way counts (see the module notes)."""
    writable = writable_cells(col, bins)
    keep = writable & (noisy >= SUPPORT_THRESHOLD * std)
    rest = writable & ~keep
    mapping = np.full(noisy.shape, -1, dtype=np.int64)
    mapping[keep] = np.arange(int(keep.sum()))
    y, w = list(noisy[keep]), [1.0] * int(keep.sum())
    if rest.any():
        mapping[rest] = int(keep.sum())
        scale = 1.0 / math.sqrt(int(rest.sum()))
        y.append(float(noisy[rest].sum()) * scale)
        w.append(scale)
    return OneWay(mapping, np.asarray(y, dtype=np.float64), np.asarray(w, dtype=np.float64))


def one_way_estimate(y: np.ndarray, weights: np.ndarray, total: float) -> np.ndarray:
    """argmin of sum (w_i mu_i - y_i)^2 over mu >= 0 with sum mu = `total`: the weighted least-squares
    projection onto the scaled simplex. By the KKT conditions mu_i = max(0, y_i / w_i - lam / w_i^2), with
    lam found by bisection."""
    target = y / weights
    curvature = weights**2

    def mass(lam: float) -> float:
        return float(np.clip(target - lam / curvature, 0.0, None).sum())

    low, high = -1.0, 1.0
    while mass(low) < total:
        low *= 2.0
    while mass(high) > total:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if mass(middle) > total:
            low = middle
        else:
            high = middle
    mu = np.clip(target - (low + high) / 2.0 / curvature, 0.0, None)
    return mu * (total / mu.sum()) if mu.sum() > 0 else np.full(len(y), total / len(y))


def pair_scores(
    reduced: Sequence[np.ndarray], sizes: Sequence[int], shares: Sequence[np.ndarray], penalty_std: float = 0.0
) -> dict[tuple[int, int], float]:
    """Each pair's selection score from the columns' reduced codes (`scores_of_pairs`)."""

    def joint(a: int, b: int) -> np.ndarray:
        return joint_counts(reduced[a], reduced[b], sizes[a], sizes[b])

    return scores_of_pairs(joint, len(reduced[0]), len(reduced), shares, penalty_std)


def scores_of_pairs(
    joint: Callable[[int, int], np.ndarray],
    n: int,
    columns: int,
    shares: Sequence[np.ndarray],
    penalty_std: float = 0.0,
) -> dict[tuple[int, int], float]:
    """Each pair's selection score: the L1 distance between its real counts over reduced codes (`joint`)
    and n times the outer product of the columns' estimated shares, less sqrt(2 / pi) `penalty_std` per
    cell (the expected L1 error of a Gaussian measurement at that std: public, so the sensitivity stays 2)."""
    scores = {}
    for a, b in itertools.combinations(range(columns), 2):
        real = joint(a, b)
        score = float(np.abs(real - n * np.outer(shares[a], shares[b]).ravel()).sum())
        scores[(a, b)] = score - math.sqrt(2.0 / math.pi) * penalty_std * real.size
    return scores


def joint_counts(a: np.ndarray, b: np.ndarray, size_a: int, size_b: int) -> np.ndarray:
    """Counts over (a, b) reduced codes, flat and row-major; a row with code -1 in either counts nowhere."""
    ok = (a >= 0) & (b >= 0)
    return np.bincount(a[ok] * size_b + b[ok], minlength=size_a * size_b).astype(np.float64)


def estimate(
    sizes: Sequence[int],
    one_way: Sequence[OneWay],
    budget: MSTBudget,
    two_way: Sequence[tuple[tuple[int, int], np.ndarray]],
    total: int,
    iterations: int,
) -> tuple[list[tuple[int, ...]], list[np.ndarray], list[int], float]:
    """`mbi`'s mirror descent on the noisy measurements: the junction tree's cliques (each after its
    parent), their normalised tables, their parents, and the final loss."""
    load_jax()
    from mbi import DatavectorQuery, Domain, LinearMeasurement, WeightedQuery, estimation, junction_tree
    from mbi.marginal_loss import from_linear_measurements

    names = [f"c{j}" for j in range(len(sizes))]
    domain = Domain(names, list(sizes))
    measurements = []
    for j, m in enumerate(one_way):
        query = WeightedQuery(m.w) if np.any(m.w != 1.0) else DatavectorQuery()
        measurements.append(LinearMeasurement(m.y, (names[j],), budget.one_way_std, query))
    for (a, b), y in two_way:
        measurements.append(LinearMeasurement(y, (names[a], names[b]), budget.two_way_std))
    model = estimation.MirrorDescent().estimate(domain, measurements, known_total=float(total), iters=iterations)
    tree, _ = junction_tree.make_junction_tree(domain, [tuple(c) for c in model.cliques])
    position_of_name = {name: j for j, name in enumerate(names)}
    cliques, tables, parents = released_cliques(
        tree,
        lambda node: tuple(position_of_name[name] for name in node),
        lambda node: np.asarray(model.project(tuple(node)).datavector(flatten=False), dtype=np.float64),
    )
    loss = float(from_linear_measurements(measurements, domain)(model.marginals))
    return cliques, tables, parents, loss
