"""Stage 2: the stratified train/validation/test split, fixed by the seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from models.config import Profile
from models.encoding import level_codes
from models.preprocessing import stratified_split, stratified_subsample
from models.schema import DatasetSchema
from tasks.stage import run_stage


def target_codes(schema: DatasetSchema, table: pd.DataFrame) -> np.ndarray:
    return level_codes(schema.column(schema.target), table[schema.target].to_numpy())


def split_stage(run_dir, schema: DatasetSchema, table_path: Path, profile: Profile):
    def work(directory: Path):
        table = pd.read_parquet(table_path)
        y = target_codes(schema, table)
        rows = np.arange(len(table))
        if profile.max_rows is not None and profile.max_rows < len(table):
            # Small profiles work on a stratified subsample, drawn with the seed.
            rows = stratified_subsample(y, profile.max_rows, profile.seed)
        parts = stratified_split(y[rows], profile.split, profile.seed)
        out = directory / "split.npz"
        np.savez(out, rows=rows, train=rows[parts["train"]], val=rows[parts["val"]], test=rows[parts["test"]])
        info = {k: len(v) for k, v in parts.items()}
        return {"split": out}, info

    config = {"seed": profile.seed, "split": profile.split, "max_rows": profile.max_rows}
    return run_stage(run_dir, "split", {"table": table_path}, config, work)
