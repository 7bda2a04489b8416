"""Mirror descent in numpy: AIM's estimate between rounds, on the same loss as private-pgm's (`mbi`)
`MirrorDescent` (Algorithm 1 of McKenna, Sheldon and Miklau 2019, with its Armijo step search).

Each round adds a measurement and so changes the model's cliques; `mbi` compiles a new jax program for
every such change, which on two CPU cores cost AIM 10 to 30 seconds a round. Here the model's marginals
come from `inference.calibrate` on a junction tree of a few small tables, with nothing to compile. The
released model is still `mbi`'s: its mirror descent runs once, on every measurement, warm-started from
these potentials (models/generators/aim/estimation.py). Either way the estimate is post-processing of the
noisy measurements.

Loss: sum over measurements of ||mu_c - y||^2 / (2 std^2), mu_c the model's counts over the measured
clique c; the potentials live on the measured cliques that no other measured clique contains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpsynth.models.generators.aim import coarse
from dpsynth.models.generators.aim.inference import Clique, broadcast_to_clique, calibrate, sum_to


@dataclass(frozen=True)
class Measurement:
    """A noisy marginal: counts `y` over `clique` (flat, row-major), Gaussian at `std`; with `groups` (one
    cells x groups 0/1 matrix per column of the clique, models/generators/aim/coarse.py) the counts are
    over those groups of cells."""

    clique: Clique
    y: np.ndarray
    std: float
    groups: tuple[np.ndarray, ...] | None = None

    def query(self, marginal: np.ndarray) -> np.ndarray:
        """What this measurement measured, read from the clique's counts `marginal` (axes in its order)."""
        return (marginal if self.groups is None else coarse.aggregate(marginal, self.groups)).ravel()

    def adjoint(self, residual: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The query's transpose applied to `residual` (flat over what was measured): over the clique."""
        if self.groups is None:
            return residual.reshape(shape)
        return coarse.spread(residual.reshape(tuple(g.shape[1] for g in self.groups)), self.groups)

    @property
    def norm_sq(self) -> float:
        """||Q||^2 of the query: 1 for a marginal, the largest group's cell count over groups."""
        return 1.0 if self.groups is None else coarse.operator_norm_sq(self.groups)


def maximal(cliques: Sequence[Clique]) -> list[Clique]:
    """The distinct cliques of `cliques` that no other one contains, sorted."""
    distinct = sorted(set(cliques))
    return [c for c in distinct if not any(set(c) < set(other) for other in distinct)]


def home_of(clique: Clique, cliques: Sequence[Clique]) -> int:
    """The first of `cliques` that contains `clique`."""
    return next(k for k, other in enumerate(cliques) if set(clique) <= set(other))


@dataclass(frozen=True)
class Model:
    """Potentials (log-space, over `cliques`) on the junction tree `nodes`/`edges` of column `sizes`."""

    sizes: tuple[int, ...]
    cliques: list[Clique]
    nodes: list[Clique]
    edges: list[tuple[int, int]]
    total: float

    def shape(self, clique: Clique) -> tuple[int, ...]:
        return tuple(self.sizes[j] for j in clique)

    def node_tables(self, theta: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The junction tree's clique counts under potentials `theta`."""
        logs = [np.zeros(self.shape(node)) for node in self.nodes]
        for clique, table in zip(self.cliques, theta, strict=True):
            k = home_of(clique, self.nodes)
            logs[k] = logs[k] + broadcast_to_clique(table, clique, self.nodes[k])
        return calibrate(self.nodes, logs, self.edges, self.total)

    def marginals(self, theta: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The counts over each potential clique under `theta`."""
        tables = self.node_tables(theta)
        return [sum_to(tables[home_of(c, self.nodes)], self.nodes[home_of(c, self.nodes)], c) for c in self.cliques]

    def warm_start(self, previous: dict[Clique, np.ndarray]) -> list[np.ndarray]:
        """Potentials over this model's cliques that give the distribution `previous` gave: each old
        table added into the first new clique that holds it (as `mbi`'s `CliqueVector.expand`)."""
        theta = [np.zeros(self.shape(c)) for c in self.cliques]
        for clique, table in previous.items():
            k = home_of(clique, self.cliques)
            theta[k] = theta[k] + broadcast_to_clique(table, clique, self.cliques[k])
        return theta


def mirror_descent(
    model: Model, measurements: Sequence[Measurement], theta: list[np.ndarray], iterations: int
) -> list[np.ndarray]:
    """`iterations` steps of mirror descent with mbi's Armijo search from potentials `theta`."""
    route = [home_of(m.clique, model.cliques) for m in measurements]

    def loss_and_gradient(mu: list[np.ndarray]) -> tuple[float, list[np.ndarray]]:
        loss, gradient = 0.0, [np.zeros_like(t) for t in mu]
        for m, r in zip(measurements, route, strict=True):
            diff = (m.query(sum_to(mu[r], model.cliques[r], m.clique)) - m.y) / m.std
            loss += 0.5 * float(diff @ diff)
            gradient[r] = gradient[r] + broadcast_to_clique(
                m.adjoint(diff / m.std, model.shape(m.clique)), m.clique, model.cliques[r]
            )
        return loss, gradient

    # The loss gradient's Lipschitz constant (exact for identity queries, a bound for groups, as mbi
    # computes it) sets the first step: 2 / (L x total).
    blocks = np.zeros(len(model.cliques))
    for m, r in zip(measurements, route, strict=True):
        blocks[r] += m.norm_sq * np.prod(model.shape(model.cliques[r])) / np.prod(model.shape(m.clique)) / m.std**2
    alpha = 2.0 / (float(blocks.max()) * model.total)
    mu = model.marginals(theta)
    loss, gradient = loss_and_gradient(mu)
    for _ in range(iterations):
        trial = [t - alpha * g for t, g in zip(theta, gradient, strict=True)]
        trial_mu = model.marginals(trial)
        trial_loss, trial_gradient = loss_and_gradient(trial_mu)
        decrease = sum(float(np.sum(g * (a - b))) for g, a, b in zip(gradient, mu, trial_mu, strict=True))
        if loss - trial_loss >= 0.5 * alpha * decrease:
            theta, mu, loss, gradient = trial, trial_mu, trial_loss, trial_gradient
            alpha *= 1.01
        else:
            alpha *= 0.5
    return theta
