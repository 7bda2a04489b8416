"""Stage 2: the train/validation/test split, row-local and secret.

Each row's split (and, for small profiles, whether it is kept at all) depends on its index and the
run's privacy secret only (models/data/preprocessing.py `row_local_split`): changing one row moves no other
row, which the privacy argument needs, and nobody who knows the profile can tell which rows trained the
generator. The secret is read from the run folder, never passed through Prefect.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth.models.config import Profile
from dpsynth.models.data.encoding import level_codes
from dpsynth.models.data.preprocessing import row_local_split, row_local_subsample
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import InvalidTableError
from dpsynth.models.privacy.secret import load as load_secret
from dpsynth.tasks.stage import StageResult, run_stage


class SplitMissesTargetLevel(InvalidTableError):
    """A split drew no row of a target level. Whether that happens depends on the rows and on the secret's
    split, so a release that stops here is counted in the table's ledger (flows/release.py): otherwise
    retrying with new secrets would probe the rows for free."""


def check_split(schema: DatasetSchema, target: np.ndarray, parts: dict[str, np.ndarray]) -> None:
    """Every split needs every target level: a table too small for that cannot be trained and evaluated."""
    column = schema.column(schema.target)
    codes = level_codes(column, target)
    for name, rows in parts.items():
        missing = [str(level) for i, level in enumerate(column.levels) if not (codes[rows] == i).any()]
        if missing:
            raise SplitMissesTargetLevel(
                f"The table is too small: its {name} split ({len(rows)} rows) holds no row with target "
                f"{schema.target!r} = {', '.join(missing)}. Use a larger table (a few hundred rows at least)."
            )


def split_stage(run_dir: Path, schema: DatasetSchema, table_path: Path, profile: Profile) -> StageResult:
    def work(directory: Path) -> tuple[dict[str, Path], dict]:
        secret = load_secret(run_dir)
        target = pd.read_parquet(table_path, columns=[schema.target])[schema.target].to_numpy()
        n_rows = len(target)
        rows = np.arange(n_rows)
        if profile.max_rows is not None and profile.max_rows < n_rows:
            # Small profiles work on a subsample, drawn row-locally from the secret too.
            rows = row_local_subsample(n_rows, profile.max_rows, secret)
        parts = row_local_split(n_rows, profile.split, secret, rows)
        check_split(schema, target, parts)
        out = directory / "split.npz"
        np.savez(out, rows=rows, train=parts["train"], val=parts["val"], test=parts["test"])
        # Split sizes depend on the secret only; still internal (they are not needed outside the run).
        info = {k: len(v) for k, v in parts.items()}
        return {"split": out}, info

    config = {"split": profile.split, "max_rows": profile.max_rows, "method": "row-local, secret"}
    return run_stage(run_dir, "split", {"table": table_path}, config, work)
