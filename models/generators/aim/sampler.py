"""Sampling an AIM generator file: AIM releases the junction-tree model MST releases
(models/generators/graphical/model.py samples any junction tree, each clique drawn given its separator
with its parent), so its sampler is theirs: numpy and pandas only, no jax, private-pgm or torch."""

from __future__ import annotations

from dpsynth.models.generators.graphical.sampler import GraphicalModelSampler


class AIMSampler(GraphicalModelSampler):
    """`sample(n_rows, seed)` from an AIM generator file's contents: rows drawn from its model with a
    generator seeded by the request's seed, encoded as every generator's rows are."""
