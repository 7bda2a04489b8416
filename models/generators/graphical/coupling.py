"""Pairs of continuous columns inside their cells: where in its coarse cell a decoded value lands, coupled
to the other columns' values, as post-processing of the released model.

MST and AIM model coarse cells (20 bins per continuous column); a value's place inside its cell is drawn
from the column's fine shape (dpsynth.models.marginals.shapes) independently of the other columns. For a
strongly monotone pair whose mass sits in few cells (a survey weight against age) most of the dependence an
analyst's quantile histogram shows is inside the cells, and independence there loses it (on a generated
census table, re-placing the real values independently inside their cells cost age x weight 0.22 of 2-way
TVD on 20 quantile cells; docs/utility-study.md section 14).

The fix reads the model alone. For each pair of continuous columns that share a clique of the model (MST's
tree edges, AIM's cliques), `pair_couplings` fits a Gaussian copula's correlation to the model's own coarse
2-way table (the polychoric correlation: the r whose bivariate normal, cut at the normal scores of the
table's margins, gives the table the highest likelihood); a maximum spanning forest over |r| keeps a tree.
When sampling (`coupled_order`), each row's latent normal scores are drawn from that tree's Gaussian
conditioned on every column's latent lying in its drawn cell's interval (a truncated normal, by Gibbs
sweeps), and inside each coarse cell the column's values, drawn exactly as before, are handed to the rows in
the order of their latent scores. Each cell keeps the same multiset of values, so every 1-way shape and
every coarse table is what it was; only which row gets which value inside a cell changes. A released model
without couplings (fitted before them) decodes as it did.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import ndtr, ndtri

from dpsynth.models.data.binning import cell_count
from dpsynth.models.data.schema import Column

# Gibbs sweeps of the truncated normal: each is one conditional draw per coupled column and row.
SWEEPS = 20
# Gauss-Legendre nodes per row interval of the polychoric likelihood.
_NODES = 16
# |r| is kept below this: the copula stays a proper Gaussian and the Gibbs conditional has some spread.
MAX_CORRELATION = 0.995
# The largest share of a 2-way table the copula's fit may put on the margins' product (noise the measurement
# spread), and how many shares from 0 to it are tried. Kept modest: an independent share explains a weak
# dependence as well as a smaller r does, and the sampler uses r for every row.
MAX_INDEPENDENT_SHARE = 0.3
_SHARES = 13


def value_order(col: Column, bins: int) -> np.ndarray:
    """The continuous column's cells in the order of their values: bins by their midpoints, a point mass at
    its value (public: bounds, bins and point masses)."""
    low, high = col.continuous_bounds
    keys = list(low + (np.arange(bins) + 0.5) * (high - low) / bins) + list(col.point_masses)
    return np.argsort(np.asarray(keys, dtype=np.float64), kind="stable")


def cell_probabilities(maps: Sequence[np.ndarray], table: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """A table over reduced codes (one axis per column of `axes`) as one over cells: a reduced code's
    probability shared equally among the cells mapped to it (the sampler's `expand`), 0 for a cell mapped
    to none."""
    out = np.asarray(table, dtype=np.float64)
    for position, j in enumerate(axes):
        mapping = np.asarray(maps[j], dtype=np.int64)
        sizes = np.bincount(mapping[mapping >= 0], minlength=out.shape[position])
        taken = np.take(out, np.maximum(mapping, 0), axis=position)
        share = np.where(mapping >= 0, 1.0 / np.maximum(sizes[np.maximum(mapping, 0)], 1), 0.0)
        shape = [1] * out.ndim
        shape[position] = len(mapping)
        out = taken * share.reshape(shape)
    return out


def polychoric(table: np.ndarray, max_independent: float = MAX_INDEPENDENT_SHARE) -> float:
    """The correlation r of a standard bivariate normal cut at the normal scores of the table's margins
    (rows and columns in value order) that, mixed with a share w <= `max_independent` of the margins'
    product, gives the table the highest likelihood: the table's rank dependence as a Gaussian copula.
    The independent share absorbs mass that a noisy measurement spread over the table, which would
    otherwise draw r towards 0 (on a generated census table a monotone pair's r was 0.80 without it from
    an `mst-eps1` model's table, 0.90 with it, and 0.90 from the real table, where w is 0). 0 for a table
    with one occupied row or column."""
    p = np.clip(np.asarray(table, dtype=np.float64), 0.0, None)
    p = p[p.sum(axis=1) > 0][:, p.sum(axis=0) > 0]
    if p.shape[0] < 2 or p.shape[1] < 2:
        return 0.0
    p = p / p.sum()
    independent = np.outer(p.sum(axis=1), p.sum(axis=0))
    rows = np.concatenate([[0.0], np.cumsum(p.sum(axis=1))])
    rows[-1] = 1.0
    cols = ndtri(np.clip(np.concatenate([[0.0], np.cumsum(p.sum(axis=0))]), 0.0, 1.0))
    cols[-1] = np.inf
    # Quadrature over each row interval in probability space: x = Phi^-1(t), t in [F(a-), F(a+)].
    nodes, weights = np.polynomial.legendre.leggauss(_NODES)
    lo, hi = rows[:-1, None], rows[1:, None]
    t = lo + (hi - lo) * (nodes[None, :] + 1.0) / 2.0
    w = (hi - lo) * weights[None, :] / 2.0
    x = ndtri(t)

    def normal_cells(r: float) -> np.ndarray:
        s = np.sqrt(1.0 - r * r)
        below = ndtr((cols[None, None, :] - r * x[:, :, None]) / s)  # rows x nodes x column edges
        return np.einsum("an,anb->ab", w, np.diff(below, axis=2))

    from scipy.optimize import minimize_scalar  # fitting only: sampling needs none of it

    best = (math.inf, 0.0)
    for share in np.linspace(0.0, max_independent, _SHARES):

        def minus_loglik(r: float, share: float = share) -> float:
            cells = (1.0 - share) * normal_cells(r) + share * independent
            return -float((p * np.log(np.maximum(cells, 1e-300))).sum())

        found = minimize_scalar(minus_loglik, bounds=(-MAX_CORRELATION, MAX_CORRELATION), method="bounded")
        if found.fun < best[0]:
            best = (float(found.fun), float(found.x))
    return best[1]


def pair_couplings(
    columns: Sequence[Column],
    bins: int,
    maps: Sequence[np.ndarray],
    cliques: Sequence[tuple[int, ...]],
    tables: Sequence[np.ndarray],
) -> tuple[tuple[int, int, float], ...]:
    """(i, j, r) for a maximum spanning forest, by |r|, of the pairs of continuous columns that share a
    clique of the model, r the polychoric correlation of the model's own 2-way table of the pair (over
    cells in value order). Reads the model's tables and public facts only."""
    continuous = {j for j, col in enumerate(columns) if col.is_continuous}
    found: dict[tuple[int, int], float] = {}
    for clique, table in zip(cliques, tables, strict=True):
        inside = sorted(j for j in clique if j in continuous)
        for a, i in enumerate(inside):
            for j in inside[a + 1 :]:
                if (i, j) in found:
                    continue
                others = tuple(k for k, c in enumerate(clique) if c not in (i, j))
                pair = np.asarray(table, dtype=np.float64).sum(axis=others)
                if clique.index(i) > clique.index(j):
                    pair = pair.T
                cells = cell_probabilities(maps, pair, (i, j))
                ordered = cells[np.ix_(value_order(columns[i], bins), value_order(columns[j], bins))]
                found[(i, j)] = polychoric(ordered)
    # Kruskal on |r|: a tree keeps the latent Gaussian proper whatever the pairwise estimates.
    parent = {j: j for j in continuous}

    def root(j: int) -> int:
        while parent[j] != j:
            j = parent[j]
        return j

    kept = []
    for (i, j), r in sorted(found.items(), key=lambda item: (-abs(item[1]), item[0])):
        if root(i) != root(j):
            parent[root(i)] = root(j)
            kept.append((i, j, r))
    return tuple(sorted(kept))


def one_way(
    maps: Sequence[np.ndarray], cliques: Sequence[tuple[int, ...]], tables: Sequence[np.ndarray], j: int
) -> np.ndarray:
    """Column j's cell probabilities from the first clique of the model that holds it."""
    for clique, table in zip(cliques, tables, strict=True):
        if j in clique:
            others = tuple(k for k, c in enumerate(clique) if c != j)
            return cell_probabilities(maps, np.asarray(table, dtype=np.float64).sum(axis=others), (j,))
    raise ValueError(f"no clique of the model holds column {j}")


def _cell_intervals(col: Column, bins: int, probabilities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per cell, its interval of latent normal scores: the normal scores of the column's cumulative
    probability before and after the cell, cells in value order."""
    order = value_order(col, bins)
    p = np.clip(np.asarray(probabilities, dtype=np.float64)[order], 0.0, None)
    edges = np.concatenate([[0.0], np.cumsum(p) / max(p.sum(), 1e-300)])
    lo, hi = np.empty(cell_count(col, bins)), np.empty(cell_count(col, bins))
    lo[order], hi[order] = ndtri(np.clip(edges[:-1], 0.0, 1.0)), ndtri(np.clip(edges[1:], 0.0, 1.0))
    return lo, hi


def _truncated_normal(mean: np.ndarray, std: float, lo: np.ndarray, hi: np.ndarray, rng) -> np.ndarray:
    """A draw of N(mean, std^2) restricted to [lo, hi] by its inverse CDF, on the side of 0 where the
    interval's tail probabilities keep their precision."""
    a, b = (lo - mean) / std, (hi - mean) / std
    flip = a > 0  # upper tail: draw -x in [-b, -a]
    a, b = np.where(flip, -b, a), np.where(flip, -a, b)
    fa, fb = ndtr(a), ndtr(b)
    x = ndtri(fa + rng.random(len(mean)) * (fb - fa))
    x = np.clip(np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0), a, b)
    x = np.where(np.isfinite(x), x, np.where(np.isfinite(a), a, b))
    return mean + std * np.where(flip, -x, x)


def latent_scores(
    columns: Sequence[Column],
    bins: int,
    couplings: Sequence[tuple[int, int, float]],
    cells: dict[int, np.ndarray],
    probabilities: dict[int, np.ndarray],
    rng: np.random.Generator,
    sweeps: int = SWEEPS,
) -> dict[int, np.ndarray]:
    """Each row's latent normal score per coupled column: the couplings' tree Gaussian (unit variances,
    correlation r on each edge, the product along the path between two columns) conditioned on each
    column's score lying in its drawn cell's interval (`probabilities`: the column's cell probabilities,
    by which the intervals are cut), drawn by `sweeps` Gibbs sweeps from independent starts."""
    coupled = sorted({j for i, j, _ in couplings} | {i for i, _, _ in couplings})
    if not coupled:
        return {}
    index = {j: k for k, j in enumerate(coupled)}
    adjacency: dict[int, list[tuple[int, float]]] = {k: [] for k in range(len(coupled))}
    for i, j, r in couplings:
        adjacency[index[i]].append((index[j], r))
        adjacency[index[j]].append((index[i], r))
    sigma = np.eye(len(coupled))
    for start in range(len(coupled)):  # path products from each column (a forest: one path at most)
        stack = [(start, 1.0, -1)]
        while stack:
            node, product, came = stack.pop()
            sigma[start, node] = product
            stack.extend((nxt, product * r, node) for nxt, r in adjacency[node] if nxt != came)
    precision = np.linalg.inv(sigma)
    bounds = {j: _cell_intervals(columns[j], bins, probabilities[j]) for j in coupled}
    lo = np.stack([bounds[j][0][cells[j]] for j in coupled])
    hi = np.stack([bounds[j][1][cells[j]] for j in coupled])
    n = lo.shape[1]
    z = np.stack([_truncated_normal(np.zeros(n), 1.0, lo[k], hi[k], rng) for k in range(len(coupled))])
    for _ in range(sweeps):
        for k in range(len(coupled)):
            q = precision[k]
            mean = -(q @ z - q[k] * z[k]) / q[k]
            z[k] = _truncated_normal(mean, 1.0 / np.sqrt(q[k]), lo[k], hi[k], rng)
    return {j: z[index[j]] for j in coupled}


def ordered_within_cells(values: np.ndarray, cells: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """The same values, re-handed inside each cell so that their order follows `scores`: a cell keeps its
    multiset of values (every 1-way shape unchanged), the row with the k-th lowest score gets its k-th
    lowest value."""
    values = np.asarray(values)
    out = values.copy()
    by_cell = np.lexsort((scores, cells))  # rows by cell, then by score
    by_value = np.lexsort((values, cells))  # rows by cell, then by value
    # Both orders list each cell's rows in one block of the same length: pair them position by position.
    out[by_cell] = values[by_value]
    return out


__all__ = [
    "MAX_CORRELATION",
    "MAX_INDEPENDENT_SHARE",
    "SWEEPS",
    "cell_probabilities",
    "latent_scores",
    "one_way",
    "ordered_within_cells",
    "pair_couplings",
    "polychoric",
    "value_order",
]
