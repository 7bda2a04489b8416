"""AIM's estimator: between rounds, mirror descent in numpy (models/generators/aim/descent.py: nothing to
compile when a round changes the model's cliques) warm-started from the previous round's potentials;
for the released model, private-pgm's (`mbi`) `MirrorDescent` on every noisy measurement, warm-started
from those potentials, with the number of rows as the known total (public under replace-one adjacency).
Both read the junction tree `mbi` builds for the measured cliques.

jax and `mbi` are imported here only, with jax set to 64-bit floats (as MST's estimator sets it) and its
compilation cache off (`mbi` compiles many small programs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsynth.models.generators.aim import descent
from dpsynth.models.generators.aim.coarse import GroupQuery
from dpsynth.models.generators.aim.descent import Measurement
from dpsynth.models.generators.aim.inference import Clique, TreeMarginals
from dpsynth.models.generators.graphical.jax_runtime import load_jax

__all__ = ["Estimator", "JunctionTree", "Measurement"]


@dataclass(frozen=True)
class JunctionTree:
    """An estimated model as numpy: its junction tree's cliques (column positions), edges (pairs of
    indices into `cliques`) and each clique's counts."""

    cliques: list[Clique]
    edges: list[tuple[int, int]]
    tables: list[np.ndarray]

    def marginals(self) -> TreeMarginals:
        return TreeMarginals(self.cliques, self.tables, self.edges)

    def graph(self) -> Any:
        """The tree as a networkx graph over the cliques (MST's `released_cliques` reads one)."""
        import networkx as nx

        graph = nx.Graph()
        graph.add_nodes_from(self.cliques)
        graph.add_edges_from((self.cliques[a], self.cliques[b]) for a, b in self.edges)
        return graph


class Estimator:
    """Estimates over columns of `sizes` cells and `total` rows, each from the last one's potentials."""

    def __init__(self, sizes: Sequence[int], total: float):
        load_jax()
        from mbi import Domain

        self.sizes = tuple(int(s) for s in sizes)
        self.names = tuple(f"c{j}" for j in range(len(sizes)))
        self.domain = Domain(self.names, list(self.sizes))
        self.total = float(total)
        self.potentials: dict[Clique, np.ndarray] = {}
        self.loss = float("nan")

    def round_fit(self, measurements: Sequence[Measurement], iterations: int) -> JunctionTree:
        """The numpy estimate on `measurements` (between rounds), and its junction tree's counts."""
        model = self._model([m.clique for m in measurements])
        theta = descent.mirror_descent(model, measurements, model.warm_start(self.potentials), iterations)
        self.potentials = dict(zip(model.cliques, theta, strict=True))
        return JunctionTree(model.nodes, model.edges, model.node_tables(theta))

    def final_fit(self, measurements: Sequence[Measurement], iterations: int) -> JunctionTree:
        """`mbi`'s mirror descent on `measurements` from the last potentials: the released model."""
        import jax.numpy as jnp
        from mbi import CliqueVector, Factor, LinearMeasurement, estimation
        from mbi.marginal_loss import from_linear_measurements

        linear = [
            LinearMeasurement(m.y, self._names(m.clique), m.std)
            if m.groups is None
            else LinearMeasurement(m.y, self._names(m.clique), m.std, GroupQuery(self._names(m.clique), m.groups))
            for m in measurements
        ]
        start = CliqueVector(
            self.domain,
            [self._names(c) for c in self.potentials],
            {
                self._names(c): Factor(self.domain.project(self._names(c)), jnp.asarray(table))
                for c, table in self.potentials.items()
            },
        )
        fitted = estimation.MirrorDescent().estimate(
            self.domain, linear, known_total=self.total, iters=iterations, warm_start=start
        )
        self.loss = float(from_linear_measurements(linear, self.domain)(fitted.marginals))
        position = {name: j for j, name in enumerate(self.names)}
        self.potentials = {
            tuple(position[a] for a in fitted.potentials[c].domain.attributes): np.asarray(
                fitted.potentials[c].values, dtype=np.float64
            )
            for c in fitted.potentials.cliques
        }
        return self.junction_tree(self.potentials)

    def junction_tree(self, potentials: dict[Clique, np.ndarray]) -> JunctionTree:
        """The junction tree of the model with log-`potentials` (tables over column-position cliques, axes
        in each clique's order), and each of its cliques' counts."""
        model = self._model(list(potentials))
        return JunctionTree(model.nodes, model.edges, model.node_tables([potentials[c] for c in model.cliques]))

    def model_megabytes(self, cliques: Sequence[Clique]) -> float:
        """The size of the junction tree a model of `cliques` would have (mbi's measure: float64 cells of
        its maximal cliques, in megabytes)."""
        from mbi.junction_tree import hypothetical_model_size

        return float(hypothetical_model_size(self.domain, [self._names(c) for c in cliques]))

    def _model(self, measured: Sequence[Clique]) -> descent.Model:
        """The potentials' cliques for `measured` and `mbi`'s junction tree of them."""
        from mbi import junction_tree

        cliques = descent.maximal(measured)
        tree, _ = junction_tree.make_junction_tree(self.domain, [self._names(c) for c in cliques])
        position = {name: j for j, name in enumerate(self.names)}
        order = list(tree.nodes)
        nodes = [tuple(position[a] for a in node) for node in order]
        index = {node: k for k, node in enumerate(order)}
        edges = [(index[a], index[b]) for a, b in tree.edges]
        return descent.Model(self.sizes, cliques, nodes, edges, self.total)

    def _names(self, clique: Clique) -> tuple[str, ...]:
        return tuple(self.names[j] for j in clique)
