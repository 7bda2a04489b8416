"""Marginals of a junction-tree model in numpy: what AIM's selection scores read each round.

A model is its junction tree's clique marginals (counts, each table's axes in its clique's order) and
the tree's edges. A marginal over any set of columns is read from one clique that holds them all, or
else from the smallest subtree whose cliques hold them: over a connected subtree of a junction tree the
joint is its root's table times each other clique's table divided by its separator's (the clique given
its parent), which `numpy.einsum` contracts to the wanted columns; the trees of a forest are
independent (the second tree's root table and after enter as shares, not counts).
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import numpy as np

Clique = tuple[int, ...]


class TreeMarginals:
    """Marginals of the model whose junction tree has `cliques` (column positions), `tables` (counts
    over each clique, axes in its order) and `edges` (pairs of clique indices)."""

    def __init__(self, cliques: Sequence[Clique], tables: Sequence[np.ndarray], edges: Sequence[tuple[int, int]]):
        self.cliques = [tuple(c) for c in cliques]
        self.tables = [np.asarray(t, dtype=np.float64) for t in tables]
        self.neighbours: dict[int, set[int]] = {k: set() for k in range(len(self.cliques))}
        for a, b in edges:
            self.neighbours[a].add(b)
            self.neighbours[b].add(a)
        self._conditionals: dict[tuple[int, int], np.ndarray] = {}

    def marginal(self, columns: Clique) -> np.ndarray:
        """The model's counts over `columns` (axes in that order)."""
        wanted = set(columns)
        for k, clique in enumerate(self.cliques):
            if wanted <= set(clique):
                return sum_to(self.tables[k], clique, columns)
        keep = self._subtree(wanted)
        letters = {c: string.ascii_letters[i] for i, c in enumerate(sorted({a for k in keep for a in self.cliques[k]}))}
        operands: list[np.ndarray] = []
        subscripts: list[str] = []
        seen: set[int] = set()
        for root in sorted(keep):  # a forest's trees are independent: each root's table is a joint of counts
            if root in seen:
                continue
            seen.add(root)
            scale = 1.0 if not operands else 1.0 / self.tables[root].sum()
            operands.append(self.tables[root] * scale)
            subscripts.append("".join(letters[a] for a in self.cliques[root]))
            queue = [root]
            while queue:
                parent = queue.pop(0)
                for child in sorted(self.neighbours[parent] & keep - seen):
                    seen.add(child)
                    queue.append(child)
                    operands.append(self._conditional(child, parent))
                    subscripts.append("".join(letters[a] for a in self.cliques[child]))
        output = "".join(letters[a] for a in columns)
        return np.einsum(f"{','.join(subscripts)}->{output}", *operands, optimize="greedy")

    def _subtree(self, wanted: set[int]) -> set[int]:
        """The cliques left after pruning, again and again, every leaf that holds no wanted column
        outside its separator (its table given the separator sums to one: the rest's joint is kept)."""
        if not all(any(a in c for c in self.cliques) for a in wanted):
            raise ValueError(f"columns {sorted(wanted)} are not all in the model")
        keep = set(range(len(self.cliques)))
        pruned = True
        while pruned and len(keep) > 1:
            pruned = False
            for k in sorted(keep):
                inside = self.neighbours[k] & keep
                if len(inside) > 1:
                    continue
                others = set().union(*(self.cliques[j] for j in inside)) if inside else set()
                if not (wanted & set(self.cliques[k])) - others:
                    keep.remove(k)
                    pruned = True
                    break
        return keep

    def _conditional(self, child: int, parent: int) -> np.ndarray:
        """The child clique's table divided by its separator's marginal (0 where that is 0)."""
        if (child, parent) not in self._conditionals:
            clique, table = self.cliques[child], self.tables[child]
            separator = set(clique) & set(self.cliques[parent])
            axes = tuple(i for i, a in enumerate(clique) if a not in separator)
            below = table.sum(axis=axes, keepdims=True)
            self._conditionals[(child, parent)] = np.divide(table, below, out=np.zeros_like(table), where=below > 0)
        return self._conditionals[(child, parent)]


def sum_to(table: np.ndarray, clique: Clique, columns: Clique) -> np.ndarray:
    """`table` over `clique` summed to `columns`, axes in that order."""
    summed = table.sum(axis=tuple(i for i, a in enumerate(clique) if a not in columns))
    kept = [a for a in clique if a in columns]
    return np.transpose(summed, [kept.index(a) for a in columns])


def calibrate(
    cliques: Sequence[Clique],
    log_potentials: Sequence[np.ndarray],
    edges: Sequence[tuple[int, int]],
    total: float,
) -> list[np.ndarray]:
    """Each clique's counts (summing to `total`) of the model whose log-potentials over the junction
    tree's `cliques` are `log_potentials` (axes in each clique's order): sum-product message passing in
    log space, towards each tree's smallest-index root and back."""
    neighbours: dict[int, list[int]] = {k: [] for k in range(len(cliques))}
    for a, b in edges:
        neighbours[a].append(b)
        neighbours[b].append(a)
    order: list[tuple[int, int]] = []  # (clique, its parent or -1), parents first
    seen: set[int] = set()
    for root in range(len(cliques)):
        if root in seen:
            continue
        seen.add(root)
        queue = [(root, -1)]
        while queue:
            node, parent = queue.pop(0)
            order.append((node, parent))
            for child in sorted(neighbours[node]):
                if child not in seen:
                    seen.add(child)
                    queue.append((child, node))
    messages: dict[tuple[int, int], np.ndarray] = {}

    def send(source: int, target: int) -> None:
        belief = log_potentials[source] + sum(
            (messages[(k, source)] for k in neighbours[source] if k != target), np.zeros(())
        )
        kept = [a for a in cliques[source] if a in cliques[target]]
        axes = tuple(i for i, a in enumerate(cliques[source]) if a not in kept)
        summed = _logsumexp(belief, axes)
        messages[(source, target)] = broadcast_to_clique(summed, kept, cliques[target])

    for node, parent in reversed(order):
        if parent >= 0:
            send(node, parent)
    for node, parent in order:
        if parent >= 0:
            send(parent, node)
    result = []
    for k in range(len(cliques)):
        belief = log_potentials[k] + sum((messages[(j, k)] for j in neighbours[k]), np.zeros(()))
        shares = np.exp(belief - _logsumexp(belief, tuple(range(belief.ndim))))
        result.append(shares * total)
    return result


def _logsumexp(values: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """log(sum(exp(values))) over `axes` (dropped), stable."""
    if not axes:
        return values
    top = np.max(values, axis=axes, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return np.squeeze(np.log(np.sum(np.exp(values - top), axis=axes, keepdims=True)) + top, axis=axes)


def broadcast_to_clique(values: np.ndarray, columns: Sequence[int], clique: Clique) -> np.ndarray:
    """`values` over `columns` (axes in that order) laid out to broadcast over `clique`'s axes."""
    ordered = [a for a in clique if a in columns]
    moved = np.transpose(values, [list(columns).index(a) for a in ordered])
    return moved.reshape([moved.shape[ordered.index(a)] if a in ordered else 1 for a in clique])
