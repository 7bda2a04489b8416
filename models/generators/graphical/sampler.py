"""Sampling an MST or AIM generator file (both release model.py's junction-tree model): rows drawn from
the released model with a generator seeded by the request's seed, encoded as every generator's rows are
(`TableEncoder`). numpy and pandas only: no jax, private-pgm or torch here (a file's tensors are read as
arrays), so the pyfunc model samples it lightly."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators.graphical.model import FORMAT, MSTModel


def model_of(blob: dict[str, Any]) -> MSTModel:
    """The model a generator file holds (its tables as tensors or arrays)."""
    if blob.get("format") != FORMAT:
        raise ValueError(f"not an MST or AIM generator file of format {FORMAT!r}: {blob.get('format')!r}")
    arrays = {name: np.asarray(values) for name, values in blob["model"]["arrays"].items()}
    return MSTModel.from_arrays(arrays, blob["model"]["meta"])


class GraphicalModelSampler:
    """`sample(n_rows, seed)` from a generator file's contents (`blob`): the training code's sampling."""

    def __init__(self, blob: dict[str, Any]):
        self.model = model_of(blob)
        schema = blob["schema"]
        self.encoder = TableEncoder(
            DatasetSchema(str(schema["name"]), int(schema["version"]), str(schema["target"]), self.model.columns)
        )
        self.width = self.encoder.width  # encoded columns per row (the pyfunc model checks the schema's)

    def sample(self, n_rows: int, seed: int) -> np.ndarray:
        rows = self.model.sample(int(n_rows), np.random.default_rng(int(seed)))
        return self.encoder.encode(rows)
