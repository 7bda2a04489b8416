"""Split and preprocessing: invalid values to missing, KNN imputation, the split of the rows.

Out-of-bounds values (by the schema's public bounds) and values outside the declared levels become
missing and are KNN-imputed (k = 3, thesis 4.5). The imputer works in a space where every column is
scaled to [0, 1] by its public bounds or level index, so that no column dominates the distances by its
unit (days against centimetres).

Row-local by construction (the privacy argument "a row reaches one critic only", docs/privacy.md section 2): a row's
split (`row_local_split`) and its place in a subsample (`row_local_subsample`) are functions of its
index and the run's secret alone, and `impute_within_groups` takes a row's donors from its own group
only (a critic's subset), so changing one row moves no other row and changes no imputed value outside
its group. `stratified_split` (which moves many rows when one label changes) stays for evaluation
splits that nothing published depends on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpsynth.models.data.encoding import level_codes
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.privacy.secret import PrivacySecret

# scikit-learn (about a second to import) is imported by the functions that use it: the command line's
# preflight reads the table in row groups sized by tasks/cell_counting.py, which imports this module, and
# uses none of it (bench/startup.py).


def invalid_to_missing(schema: DatasetSchema, frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """Numeric copy of the schema's columns with invalid values as NaN, and per-column counts of
    values that will be imputed (missing or outside bounds/levels)."""
    out, counts = {}, {}
    for col in schema.columns:
        if col.kind == "continuous":
            values = pd.to_numeric(frame[col.name], errors="coerce").to_numpy(dtype=np.float64)
            low, high = col.continuous_bounds
            invalid = np.isnan(values) | (values < low) | (values > high)
            values = values.copy()
            values[invalid] = np.nan
        else:
            # Discrete columns are carried as level indices so that string levels work too.
            codes = level_codes(col, frame[col.name].to_numpy())
            invalid = codes < 0
            values = np.asarray(col.levels, dtype=object)[np.maximum(codes, 0)]
            values = pd.array(np.where(invalid, None, values), dtype=object)
        out[col.name] = values
        counts[col.name] = int(invalid.sum())
    return pd.DataFrame(out, index=frame.index), counts


def row_local_split(
    n_rows: int, fractions: tuple[float, float, float], secret: PrivacySecret, rows: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Row indices of train/validation/test: row i goes to a split by the i-th of n_rows uniform draws
    of the secret's "split" stream, so its split depends on i and the secret only (not on any row's
    values). The split sizes are then binomial around the fractions. `rows` restricts the result to
    those row indices (a subsample) without changing any row's draw."""
    draws = secret.numpy("split").random(n_rows)
    train_cut, val_cut = fractions[0], fractions[0] + fractions[1]
    rows = np.arange(n_rows) if rows is None else np.sort(np.asarray(rows, dtype=np.int64))
    u = draws[rows]
    return {"train": rows[u < train_cut], "val": rows[(u >= train_cut) & (u < val_cut)], "test": rows[u >= val_cut]}


def row_local_subsample(n_rows: int, keep: int, secret: PrivacySecret) -> np.ndarray:
    """Sorted indices of `keep` of n_rows rows: those with the smallest draws of the secret's
    "subsample" stream, a choice that depends on the indices and the secret only."""
    if keep >= n_rows:
        return np.arange(n_rows)
    draws = secret.numpy("subsample").random(n_rows)
    return np.sort(np.argpartition(draws, keep - 1)[:keep])


def row_local_bound(n_rows: int, rows: np.ndarray, keep: int, secret: PrivacySecret) -> np.ndarray:
    """Sorted indices of at most `keep` of `rows` (indices among n_rows): those with the smallest draws of
    the secret's "evaluation" stream, a choice that depends on the indices and the secret only; `rows`
    itself when it has at most `keep` (then nothing is drawn)."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) <= keep:
        return rows
    draws = secret.numpy("evaluation").random(n_rows)[rows]
    return np.sort(rows[np.argpartition(draws, keep - 1)[:keep]])


def stratified_split(y: np.ndarray, fractions: tuple[float, float, float], seed: int) -> dict[str, np.ndarray]:
    """Row indices of train/validation/test, stratified by the target, fixed by the seed."""
    from sklearn.model_selection import train_test_split

    index = np.arange(len(y))
    _, val_frac, test_frac = fractions
    n_test = round(test_frac * len(y))
    n_val = round(val_frac * len(y))
    stratify = y if _can_stratify(y, n_test) else None
    rest, test = train_test_split(index, test_size=n_test, random_state=seed, stratify=stratify)
    stratify = y[rest] if _can_stratify(y[rest], n_val) else None
    train, val = train_test_split(rest, test_size=n_val, random_state=seed + 1, stratify=stratify)
    return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}


def _can_stratify(y: np.ndarray, n_holdout: int) -> bool:
    _, counts = np.unique(y, return_counts=True)
    return len(counts) > 1 and counts.min() >= 2 and n_holdout >= len(counts)


@dataclass
class UnitScaledImputer:
    """KNN imputation in the [0, 1] space of public bounds and level indices."""

    schema: DatasetSchema
    neighbors: int = 3

    def __post_init__(self) -> None:
        from sklearn.impute import KNNImputer

        self._imputer = KNNImputer(n_neighbors=self.neighbors)

    def _to_unit(self, frame: pd.DataFrame) -> np.ndarray:
        cols = []
        for col in self.schema.columns:
            if col.kind == "continuous":
                values = frame[col.name].to_numpy(dtype=np.float64)
                low, high = col.continuous_bounds
                cols.append((values - low) / (high - low))
            else:
                codes = level_codes(col, frame[col.name].to_numpy()).astype(np.float64)
                codes[codes < 0] = np.nan
                cols.append(codes / (len(col.levels) - 1))
        return np.column_stack(cols)

    def _from_unit(self, unit: np.ndarray, index: pd.Index) -> pd.DataFrame:
        out = {}
        for j, col in enumerate(self.schema.columns):
            if col.kind == "continuous":
                low, high = col.continuous_bounds
                values = np.clip(np.round(unit[:, j] * (high - low) + low, col.decimals), low, high)
            else:
                codes = np.clip(np.round(unit[:, j] * (len(col.levels) - 1)), 0, len(col.levels) - 1)
                values = np.asarray(col.levels, dtype=object)[codes.astype(np.int64)]
            out[col.name] = values
        return pd.DataFrame(out, index=index)

    def fit(self, frame: pd.DataFrame) -> UnitScaledImputer:
        unit = self._to_unit(frame)
        complete_enough = ~np.all(np.isnan(unit), axis=0)
        if not complete_enough.all():
            missing = [c.name for c, ok in zip(self.schema.columns, complete_enough, strict=False) if not ok]
            raise ValueError(f"cannot impute: no valid value in column(s) {', '.join(missing)}")
        self._imputer.fit(unit)
        return self

    def transform(self, frame: pd.DataFrame) -> pd.DataFrame:
        unit = self._to_unit(frame)
        rows = np.isnan(unit).any(axis=1)
        if rows.any():
            # Only rows with a gap need neighbour search; the rest pass through unchanged.
            unit[rows] = self._imputer.transform(unit[rows])
        return self._from_unit(unit, frame.index)

    def fill_public(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Every gap to the middle of its public range (unit 0.5): each row from itself alone, as
        `impute_groups` with every row its own group."""
        unit = self._to_unit(frame)
        unit[np.isnan(unit)] = 0.5
        return self._from_unit(unit, frame.index)

    def impute_groups(self, frame: pd.DataFrame, groups: list[np.ndarray]) -> pd.DataFrame:
        """Impute each group of rows (positions into `frame`) from donors of the same group only.

        A column with no valid value in a group is filled with the middle of its public range (unit
        0.5) in that group's incomplete rows: no donor exists, and anything taken from outside the
        group would couple the groups. Rows in no group are returned unchanged."""
        unit = self._to_unit(frame)
        gaps = np.isnan(unit)
        for members in groups:
            members = np.asarray(members)
            if members.size == 0 or not gaps[members].any():
                continue
            block = unit[members]
            empty = np.all(np.isnan(block), axis=0)
            block[:, empty] = 0.5
            incomplete = np.isnan(block).any(axis=1)
            if incomplete.any():
                from sklearn.impute import KNNImputer

                imputer = KNNImputer(n_neighbors=self.neighbors).fit(block)
                block[incomplete] = imputer.transform(block[incomplete])
            unit[members] = block
        return self._from_unit(unit, frame.index)


def typed_frame(schema: DatasetSchema, frame: pd.DataFrame) -> pd.DataFrame:
    """Cast a complete numeric frame to the schema's dtypes (integers where the schema has no decimals)."""
    out = {}
    for col in schema.columns:
        values = frame[col.name].to_numpy()
        if col.kind == "continuous":
            values = values.astype(np.float64)
            out[col.name] = values if col.decimals > 0 else np.round(values).astype(np.int64)
        elif all(isinstance(level, int) for level in col.levels):
            out[col.name] = values.astype(np.int64)
        else:
            out[col.name] = values
    return pd.DataFrame(out, index=frame.index)
