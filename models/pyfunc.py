"""The released generator as an MLflow pyfunc model: `predict` turns (n_rows, seed) into synthetic rows.

The model is logged with two artifacts, the generator file (``generator``: spec and weights of the
released generator only, no critic) and the dataset schema (``schema``: public bounds and levels), and
with this package as its code (``code_paths``), so that

    mlflow.pyfunc.load_model("models:/cardio-gswgan@champion").predict(pd.DataFrame({"n_rows": [1000],
                                                                                    "seed": [0]}))

works in a fresh process where dpsynth is not installed. Loading and sampling use only this package's
networks, encoder and schema, torch, numpy, pandas and yaml: no Prefect, no flows, and not
`models.gswgan` (whose accountant needs autodp). This is the one module of `models` that imports
MLflow; nothing else in the package imports this one.

Everything the model emits is sampled from the DP generator, so it is covered by the release's epsilon.
"""

from __future__ import annotations

from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch

from models.encoding import TableEncoder
from models.networks import Generator
from models.schema import DatasetSchema

GENERATOR_ARTIFACT = "generator"
SCHEMA_ARTIFACT = "schema"
INPUT_COLUMNS = ("n_rows", "seed")
# Largest request one predict call serves (rows are generated in batches, but all held in memory).
MAX_ROWS = 10_000_000
_BATCH = 8192


def load_generator_file(path: str | Path, device: str | torch.device = "cpu") -> tuple[Generator, dict]:
    """Rebuild a released generator from its file ({"spec", "state_dict", "iteration", "epsilon",
    "delta"}), in eval mode. Same result as `models.gswgan.load_generator`, without its imports."""
    blob = torch.load(path, map_location=device, weights_only=True)
    spec = blob["spec"]
    condition = spec.get("condition")
    gen = Generator(int(spec["z_dim"]), tuple(spec["hidden"]), int(spec["out_width"]), spec["head"],
                    [tuple(g) for g in spec["groups"]],
                    (int(condition[0]), float(condition[1])) if condition is not None else None)
    gen.load_state_dict(blob["state_dict"])
    gen.eval()
    return gen, {k: v for k, v in blob.items() if k != "state_dict"}


def sample_table(gen: Generator, encoder: TableEncoder, n_rows: int, seed: int) -> pd.DataFrame:
    """n rows decoded to the schema, from generator inputs (z ~ N(0, I), and labels) fixed by the seed.

    Draws z exactly as `models.gswgan.sample_encoded` does (one seeded CPU generator, batches of 8192),
    so the same (file, n_rows, seed) gives the same rows through either path.
    """
    rng = torch.Generator().manual_seed(int(seed))
    device = next(gen.parameters()).device
    gen.eval()
    parts = []
    with torch.no_grad():
        for start in range(0, n_rows, _BATCH):
            z = gen.latent(min(_BATCH, n_rows - start), rng).to(device)
            parts.append(gen(z).cpu().numpy())
    matrix = np.concatenate(parts) if parts else np.zeros((0, encoder.width), dtype=np.float32)
    return encoder.decode(matrix)


def _requests(model_input) -> list[tuple[int, int]]:
    """(n_rows, seed) per input row; one row is the usual request, several are concatenated."""
    if isinstance(model_input, dict):
        model_input = pd.DataFrame({k: np.atleast_1d(v) for k, v in model_input.items()})
    if not isinstance(model_input, pd.DataFrame):
        raise TypeError("predict expects a DataFrame with columns 'n_rows' and 'seed', "
                        f"not {type(model_input).__name__}.")
    missing = [c for c in INPUT_COLUMNS if c not in model_input.columns]
    if missing:
        raise ValueError(f"predict input lacks column(s) {', '.join(missing)}: expected one row with "
                         "'n_rows' (how many synthetic rows) and 'seed' (an integer).")
    if len(model_input) == 0:
        raise ValueError("predict input has no rows: expected one row with 'n_rows' and 'seed'.")
    requests = []
    for n_rows, seed in zip(model_input["n_rows"], model_input["seed"]):
        if pd.isna(n_rows) or pd.isna(seed) or float(n_rows) != int(n_rows) or float(seed) != int(seed):
            raise ValueError("'n_rows' and 'seed' must be integers.")
        if not 0 <= int(n_rows) <= MAX_ROWS:
            raise ValueError(f"'n_rows' must be between 0 and {MAX_ROWS}, not {int(n_rows)}.")
        requests.append((int(n_rows), int(seed)))
    return requests


class SyntheticTableModel(mlflow.pyfunc.PythonModel):
    """Synthetic rows in the original schema from a released DP generator."""

    def load_context(self, context) -> None:
        self.generator, self.info = load_generator_file(context.artifacts[GENERATOR_ARTIFACT])
        self.schema = DatasetSchema.from_yaml(context.artifacts[SCHEMA_ARTIFACT])
        self.encoder = TableEncoder(self.schema)
        if int(self.info["spec"]["out_width"]) != self.encoder.width:
            raise ValueError(f"The generator emits {self.info['spec']['out_width']} encoded columns but the "
                             f"schema {self.schema.name!r} encodes to {self.encoder.width}.")

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        """`model_input`: a DataFrame with one row, columns `n_rows` and `seed`. Returns `n_rows` rows
        with the schema's columns, types, bounds and levels."""
        frames = [sample_table(self.generator, self.encoder, n, s) for n, s in _requests(model_input)]
        return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
