"""Sampling an AIM generator file: AIM releases MST's junction-tree model (models/generators/mst/model.py
samples any junction tree, each clique drawn given its separator with its parent), so its sampler is
MST's: numpy and pandas only, no jax, private-pgm or torch."""

from __future__ import annotations

from dpsynth.models.generators.mst.sampler import MSTSampler


class AIMSampler(MSTSampler):
    """`sample(n_rows, seed)` from an AIM generator file's contents: rows drawn from its model with a
    generator seeded by the request's seed, encoded as every generator's rows are."""
