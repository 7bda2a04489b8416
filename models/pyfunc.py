"""The released generator as an MLflow pyfunc model: `predict` turns (n_rows, seed) into synthetic rows.

The model is logged with two artifacts, the generator file (``generator``: spec and weights of the
released generator only, no critic) and the dataset schema (``schema``: public bounds and levels), and
with this package as its code (``code_paths``), so that

    mlflow.pyfunc.load_model("models:/cardio-gswgan@champion").predict(pd.DataFrame({"n_rows": [1000],
                                                                                    "seed": [0]}))

works in a fresh process where dpsynth is not installed (`seed` is optional: without it, or with a
missing value, a request draws fresh randomness from the operating system; a given seed gives the same
rows every time). Loading and sampling use only this package's
networks, encoder and schema, torch, numpy, pandas and yaml (models/generators/samplers.py, for
every generator type): no Prefect, no flows, no accountant (autodp, Opacus). This is the one module of `models`
that imports
MLflow; nothing else in the package imports this one.

Everything the model emits is sampled from the DP generator, so it is covered by the release's epsilon.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mlflow.models import ModelSignature, infer_signature
from mlflow.pyfunc import PythonModel, PythonModelContext
from mlflow.types import ColSpec, Schema

from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators.samplers import (
    fresh_seed,
    public_facts,
    read_generator_file,
    sample_rows,
    sampler_from_blob,
)

GENERATOR_ARTIFACT = "generator"
SCHEMA_ARTIFACT = "schema"
INPUT_COLUMNS = ("n_rows", "seed")
REQUIRED_COLUMNS = ("n_rows",)
# Largest request one predict call serves (rows are generated in batches, but all held in memory).
MAX_ROWS = 10_000_000


def load_generator_file(path: str | Path) -> tuple[Any, dict[str, object]]:
    """A `Sampler` (models/generators/samplers.py) for a released generator file of any generator type,
    and the file's public facts (spec, iteration, epsilon, delta, generator). The generator types'
    samplers share no base class, hence Any."""
    blob = read_generator_file(path)
    return sampler_from_blob(blob), public_facts(blob)


def model_signature(output_example: pd.DataFrame) -> ModelSignature:
    """The registered model's signature: `n_rows` required, `seed` optional (MLflow enforces the
    signature before `predict` runs, so a required `seed` would refuse a request without one)."""
    inputs = Schema([ColSpec("long", "n_rows"), ColSpec("long", "seed", required=False)])
    return ModelSignature(inputs=inputs, outputs=infer_signature(None, output_example).outputs)


def sample_table(sampler: Any, encoder: TableEncoder, n_rows: int, seed: int) -> pd.DataFrame:
    """n rows decoded to the schema, from generator inputs fixed by the seed, calibrated to the file's
    measured marginals when it carries them: the same rows as the training code's sampling of the same
    file (both go through `sample_rows`)."""
    return sample_rows(sampler, encoder, n_rows, seed)


def _requests(model_input: object) -> list[tuple[int, int]]:
    """(n_rows, seed) per input row; one row is the usual request, several are concatenated."""
    if isinstance(model_input, dict):
        model_input = pd.DataFrame({k: np.atleast_1d(v) for k, v in model_input.items()})
    if not isinstance(model_input, pd.DataFrame):
        raise TypeError(
            f"predict expects a DataFrame with column 'n_rows' (and optionally 'seed'), "
            f"not {type(model_input).__name__}."
        )
    missing = [c for c in REQUIRED_COLUMNS if c not in model_input.columns]
    if missing:
        raise ValueError(
            f"predict input lacks column(s) {', '.join(missing)}: expected one row with "
            "'n_rows' (how many synthetic rows) and optionally 'seed' (an integer)."
        )
    if len(model_input) == 0:
        raise ValueError("predict input has no rows: expected one row with 'n_rows' (and optionally 'seed').")
    seeds = model_input["seed"] if "seed" in model_input.columns else [None] * len(model_input)
    requests = []
    for n_rows, seed in zip(model_input["n_rows"], seeds, strict=True):
        if pd.isna(n_rows) or float(n_rows) != int(n_rows):
            raise ValueError("'n_rows' must be an integer.")
        if seed is not None and not pd.isna(seed) and float(seed) != int(seed):
            raise ValueError("'seed' must be an integer (or left out, for fresh rows).")
        if not 0 <= int(n_rows) <= MAX_ROWS:
            raise ValueError(f"'n_rows' must be between 0 and {MAX_ROWS}, not {int(n_rows)}.")
        requests.append((int(n_rows), fresh_seed() if seed is None or pd.isna(seed) else int(seed)))
    return requests


class SyntheticTableModel(PythonModel):
    """Synthetic rows in the original schema from a released DP generator."""

    def load_context(self, context: PythonModelContext) -> None:
        self.generator, self.info = load_generator_file(context.artifacts[GENERATOR_ARTIFACT])
        self.schema = DatasetSchema.from_yaml(context.artifacts[SCHEMA_ARTIFACT])
        self.encoder = TableEncoder(self.schema)
        if int(self.generator.width) != self.encoder.width:
            raise ValueError(
                f"The generator emits {self.generator.width} encoded columns but the "
                f"schema {self.schema.name!r} encodes to {self.encoder.width}."
            )

    def predict(
        self, context: PythonModelContext, model_input: pd.DataFrame, params: dict | None = None
    ) -> pd.DataFrame:
        """`model_input`: a DataFrame with one row, columns `n_rows` and (optionally) `seed`. Returns
        `n_rows` rows with the schema's columns, types, bounds and levels."""
        frames = [sample_table(self.generator, self.encoder, n, s) for n, s in _requests(model_input)]
        return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
