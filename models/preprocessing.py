"""Split and preprocessing: invalid values to missing, KNN imputation, stratified split.

Out-of-bounds values (by the schema's public bounds) and values outside the declared levels become
missing and are KNN-imputed (k = 3, thesis 4.5). The imputer is fitted on the rows that train the
generator only. It works in a space where every column is scaled to [0, 1] by its public bounds or
level index, so that no column dominates the distances by its unit (days against centimetres).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.impute import KNNImputer
from sklearn.model_selection import train_test_split

from models.encoding import level_codes
from models.schema import DatasetSchema


def invalid_to_missing(schema: DatasetSchema, frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """Numeric copy of the schema's columns with invalid values as NaN, and per-column counts of
    values that will be imputed (missing or outside bounds/levels)."""
    out, counts = {}, {}
    for col in schema.columns:
        if col.kind == "continuous":
            values = pd.to_numeric(frame[col.name], errors="coerce").to_numpy(dtype=np.float64)
            low, high = col.bounds
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


def stratified_split(y: np.ndarray, fractions: tuple[float, float, float], seed: int) -> dict[str, np.ndarray]:
    """Row indices of train/validation/test, stratified by the target, fixed by the seed."""
    index = np.arange(len(y))
    _, val_frac, test_frac = fractions
    n_test = round(test_frac * len(y))
    n_val = round(val_frac * len(y))
    stratify = y if _can_stratify(y, n_test) else None
    rest, test = train_test_split(index, test_size=n_test, random_state=seed, stratify=stratify)
    stratify = y[rest] if _can_stratify(y[rest], n_val) else None
    train, val = train_test_split(rest, test_size=n_val, random_state=seed + 1, stratify=stratify)
    return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}


def stratified_subsample(y: np.ndarray, n_rows: int, seed: int) -> np.ndarray:
    """Sorted indices of `n_rows` rows keeping the target's proportions, drawn with the seed."""
    index = np.arange(len(y))
    stratify = y if _can_stratify(y, len(y) - n_rows) and _can_stratify(y, n_rows) else None
    picked, _ = train_test_split(index, train_size=n_rows, random_state=seed, stratify=stratify)
    return np.sort(picked)


def _can_stratify(y: np.ndarray, n_holdout: int) -> bool:
    _, counts = np.unique(y, return_counts=True)
    return len(counts) > 1 and counts.min() >= 2 and n_holdout >= len(counts)


@dataclass
class UnitScaledImputer:
    """KNN imputation in the [0, 1] space of public bounds and level indices."""

    schema: DatasetSchema
    neighbors: int = 3

    def __post_init__(self):
        self._imputer = KNNImputer(n_neighbors=self.neighbors)

    def _to_unit(self, frame: pd.DataFrame) -> np.ndarray:
        cols = []
        for col in self.schema.columns:
            if col.kind == "continuous":
                values = frame[col.name].to_numpy(dtype=np.float64)
                low, high = col.bounds
                cols.append((values - low) / (high - low))
            else:
                codes = level_codes(col, frame[col.name].to_numpy()).astype(np.float64)
                codes[codes < 0] = np.nan
                cols.append(codes / (len(col.levels) - 1))
        return np.column_stack(cols)

    def _from_unit(self, unit: np.ndarray, index) -> pd.DataFrame:
        out = {}
        for j, col in enumerate(self.schema.columns):
            if col.kind == "continuous":
                low, high = col.bounds
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
            missing = [c.name for c, ok in zip(self.schema.columns, complete_enough) if not ok]
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
