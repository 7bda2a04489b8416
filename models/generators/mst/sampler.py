"""Sampling an MST generator file: rows drawn from the released junction-tree model (shared with AIM:
models/generators/graphical/sampler.py). numpy and pandas only: no jax, private-pgm or torch."""

from __future__ import annotations

from dpsynth.models.generators.graphical.sampler import GraphicalModelSampler, model_of

__all__ = ["MSTSampler", "model_of"]


class MSTSampler(GraphicalModelSampler):
    """`sample(n_rows, seed)` from an MST generator file's contents: rows drawn from its model with a
    generator seeded by the request's seed, encoded as every generator's rows are."""
