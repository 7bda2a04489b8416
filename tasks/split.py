"""Stage 2: the train/validation/test split, row-local and secret.

Each row's split (and, for small profiles, whether it is kept at all) depends on its index and the
run's privacy secret only (models/data/preprocessing.py `row_local_split`): changing one row moves no other
row, which the privacy argument needs, and nobody who knows the profile can tell which rows trained the
generator. The secret is read from the run folder, never passed through Prefect.

A part that draws no row of a target level is recorded, not refused (`missing_target_levels`).

Evaluation against real rows (the real baseline, the AUCs, the DP choice's validation rows, the internal
report) reads at most `EVALUATION_ROWS` rows of each part: on a larger table the validation and test
parts, and the training rows evaluation reads (`eval_train`; the generator still trains on every
training row), are row-local subsamples drawn from the secret (`row_local_bound`), so evaluation costs
the same on a census of millions as on a table of a few hundred thousand rows. Tables whose parts fit
(up to about 125,000 rows at the usual 0.8 / 0.1 / 0.1) are evaluated on every row, as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpsynth.models.config import Profile
from dpsynth.models.data.encoding import level_codes
from dpsynth.models.data.preprocessing import row_local_bound, row_local_split, row_local_subsample
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.privacy.secret import PrivacySecret
from dpsynth.models.privacy.secret import load as load_secret
from dpsynth.tasks.stage import StageResult, run_stage

# The most rows of each part (training, validation, test) evaluation reads (see the module notes).
EVALUATION_ROWS = 100_000


class SplitFile(Mapping[str, np.ndarray]):
    """The parts of a split stage's `split.npz`, each read when first used (then kept): a stage reads
    only the parts it uses. On a census-size table `rows` and `train` take 8 bytes a row each (144 MB at
    10,000,000 rows), and evaluation, which reads only the bounded parts, never holds them."""

    def __init__(self, path: str | Path):
        self._path = Path(path)
        with np.load(self._path) as parts:
            self._names = list(parts.files)
        self._read: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._read:
            if name not in self._names:
                raise KeyError(name)
            with np.load(self._path) as parts:
                self._read[name] = parts[name]
        return self._read[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def evaluation_train(split: Mapping[str, np.ndarray]) -> np.ndarray:
    """The training rows evaluation reads: all of them, or their bounded subsample on a large table."""
    return split["eval_train"] if "eval_train" in split else split["train"]


@dataclass(frozen=True)
class SecretSplit:
    """The rows a run works on, their train/validation/test parts, and the target levels each part
    happens to lack (internal: a fact of the rows)."""

    rows: np.ndarray
    parts: dict[str, np.ndarray]
    missing_levels: dict[str, list[str]]
    evaluation_train: np.ndarray | None = None  # the training rows evaluation reads (None: all of them)


def missing_target_levels(
    schema: DatasetSchema, target_codes: np.ndarray, parts: dict[str, np.ndarray]
) -> dict[str, list[str]]:
    """The target levels with no row in each part (only the parts that lack one); `target_codes` holds each
    row's index in the target's levels (`target_level_codes`).

    Recorded in the run folder, never a reason to stop or to take another path: whether a part lacks a
    level depends on the rows and on the split the secret drew, which epsilon does not cover (with 2
    rows of the rarer level a release would never proceed, with 3 it would 5% of the time: one row apart,
    a delta of 0.05). Every later stage copes with a part without a level: the DP choice and approval
    count no concordant pair (P = 0) at unchanged sensitivities, and the internal AUCs are NaN."""
    column = schema.column(schema.target)
    missing = {
        name: [str(level) for i, level in enumerate(column.levels) if not (target_codes[rows] == i).any()]
        for name, rows in parts.items()
    }
    return {name: levels for name, levels in missing.items() if levels}


def target_level_codes(schema: DatasetSchema, table_path: str | Path) -> np.ndarray:
    """Each row's index in the target's declared levels (`level_codes`), read from the validated table
    one row group at a time: 4 bytes a row, where the column read whole as Python strings took about 65
    (650 MB at 10,000,000 rows, the split stage's peak)."""
    import pyarrow.parquet as pq

    column = schema.column(schema.target)
    table = pq.ParquetFile(table_path)
    codes = np.empty(table.metadata.num_rows, dtype=np.int32)
    start = 0
    for group in range(table.num_row_groups):
        values = table.read_row_group(group, columns=[schema.target]).column(0).to_pandas()
        codes[start : start + len(values)] = level_codes(column, values)
        start += len(values)
    return codes


def secret_split(
    schema: DatasetSchema, target_codes: np.ndarray, profile: Profile, secret: PrivacySecret
) -> SecretSplit:
    """The split of a table whose target levels are `target_codes` (`target_level_codes`), drawn from
    `secret` (see the module notes)."""
    n_rows = len(target_codes)
    rows = np.arange(n_rows)
    if profile.max_rows is not None and profile.max_rows < n_rows:
        # Small profiles work on a subsample, drawn row-locally from the secret too.
        rows = row_local_subsample(n_rows, profile.max_rows, secret)
    parts = row_local_split(n_rows, profile.split, secret, rows)
    evaluation = None
    if profile.protocol != "thesis":  # the thesis protocol re-splits every row for each evaluation
        parts = {**parts, **{k: row_local_bound(n_rows, parts[k], EVALUATION_ROWS, secret) for k in ("val", "test")}}
        bounded = row_local_bound(n_rows, parts["train"], EVALUATION_ROWS, secret)
        evaluation = bounded if len(bounded) < len(parts["train"]) else None
    return SecretSplit(rows, parts, missing_target_levels(schema, target_codes, parts), evaluation)


def split_stage(run_dir: Path, schema: DatasetSchema, table_path: Path, profile: Profile) -> StageResult:
    def work(directory: Path) -> tuple[dict[str, Path], dict]:
        drawn = secret_split(schema, target_level_codes(schema, table_path), profile, load_secret(run_dir))
        out = directory / "split.npz"
        parts = drawn.parts
        # Any: numpy's stubs would read an extra array as savez's own `allow_pickle` flag.
        bounded: dict[str, Any] = {} if drawn.evaluation_train is None else {"eval_train": drawn.evaluation_train}
        np.savez(out, rows=drawn.rows, train=parts["train"], val=parts["val"], test=parts["test"], **bounded)
        # Split sizes depend on the secret only; the missing levels on the rows: both internal (the
        # stage's manifest in the run folder), and nothing downstream reads the missing levels.
        info = {**{k: len(v) for k, v in parts.items()}, "missing_target_levels": drawn.missing_levels}
        return {"split": out}, info

    config = {
        "split": profile.split,
        "max_rows": profile.max_rows,
        "method": "row-local, secret",
        "evaluation_rows": EVALUATION_ROWS,
    }
    return run_stage(run_dir, "split", {"table": table_path}, config, work)
