"""Schema encoder/decoder: table <-> matrix in [-1, 1], using only the schema's public bounds and levels.

Continuous columns are min-max scaled by their declared bounds; a binary column is one value (-1 for the
first level, +1 for the second); a categorical column is one-hot with -1/+1 entries (thesis 4.5: one-hot,
then everything scaled to the Tanh range). The decoder is the exact inverse on valid rows and maps any
generator output back to a valid row: unscale, clip to bounds, round to the declared decimals, threshold
binaries at 0, argmax over one-hot groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from dpsynth.models.data.schema import Column, DatasetSchema


@dataclass(frozen=True)
class EncodedBlock:
    column: Column
    start: int
    stop: int

    @property
    def slice(self) -> slice:
        return slice(self.start, self.stop)


class TableEncoder:
    def __init__(self, schema: DatasetSchema):
        self.schema = schema
        blocks, start = [], 0
        for col in schema.columns:
            blocks.append(EncodedBlock(col, start, start + col.encoded_width))
            start += col.encoded_width
        self.blocks: tuple[EncodedBlock, ...] = tuple(blocks)
        self.width = start

    def block(self, name: str) -> EncodedBlock:
        return next(b for b in self.blocks if b.column.name == name)

    @property
    def target_index(self) -> int:
        return self.block(self.schema.target).start

    @property
    def feature_indices(self) -> np.ndarray:
        """Encoded columns a downstream classifier sees: everything but the target."""
        return np.array([i for i in range(self.width) if i != self.target_index])

    def head_groups(self) -> list[tuple[int, int, str]]:
        """(start, stop, kind) of every block: what the generator's output head needs to know."""
        return [(b.start, b.stop, b.column.kind) for b in self.blocks]

    def encoded_names(self) -> list[str]:
        names = []
        for b in self.blocks:
            if b.column.kind == "categorical":
                names += [f"{b.column.name}={lvl}" for lvl in b.column.levels]
            else:
                names.append(b.column.name)
        return names

    def encode(self, frame: pd.DataFrame) -> np.ndarray:
        """Encode a complete table (no missing values, every value within bounds and levels)."""
        out = np.empty((len(frame), self.width), dtype=np.float32)
        for b in self.blocks:
            col = b.column
            values = frame[col.name].to_numpy()
            if col.kind == "continuous":
                low, high = col.continuous_bounds
                scaled = 2.0 * (values.astype(np.float64) - low) / (high - low) - 1.0
                out[:, b.start] = np.clip(scaled, -1.0, 1.0)
            else:
                codes = level_codes(col, values)
                if np.any(codes < 0):
                    raise ValueError(f"column {col.name!r} holds values outside its declared levels")
                if col.kind == "binary":
                    out[:, b.start] = np.where(codes == 1, 1.0, -1.0)
                else:
                    onehot = -np.ones((len(frame), len(col.levels)), dtype=np.float32)
                    onehot[np.arange(len(frame)), codes] = 1.0
                    out[:, b.slice] = onehot
        return out

    def decode(self, matrix: np.ndarray) -> pd.DataFrame:
        """Map any matrix of the encoded width (e.g. generator output) to valid rows of the schema."""
        matrix = np.asarray(matrix, dtype=np.float64)
        columns = {}
        for b in self.blocks:
            col = b.column
            if col.kind == "continuous":
                low, high = col.continuous_bounds
                values = (np.clip(matrix[:, b.start], -1.0, 1.0) + 1.0) / 2.0 * (high - low) + low
                values = np.clip(np.round(values, col.decimals), low, high)
                columns[col.name] = values.astype(np.int64) if col.decimals == 0 else values
            elif col.kind == "binary":
                codes = (matrix[:, b.start] > 0).astype(np.int64)
                columns[col.name] = _levels_array(col)[codes]
            else:
                codes = np.argmax(matrix[:, b.slice], axis=1)
                columns[col.name] = _levels_array(col)[codes]
        return pd.DataFrame(columns)

    def level_shares(self, matrix: np.ndarray) -> dict[str, dict[str, float]]:
        """Share of each level of each binary/categorical column, as the decoder would emit it."""
        return self.frame_level_shares(self.decode(matrix))

    def frame_level_shares(self, decoded: pd.DataFrame) -> dict[str, dict[str, float]]:
        """Share of each level of each binary/categorical column of decoded rows."""
        shares = {}
        for col in self.schema.discrete:
            counts = decoded[col.name].value_counts(normalize=True)
            shares[col.name] = {str(lvl): float(counts.get(lvl, 0.0)) for lvl in col.levels}
        return shares


def level_codes(col: Column, values: ArrayLike) -> np.ndarray:
    """Index of each value in the column's declared levels; -1 where it is not a level."""
    series = pd.Series(values)
    codes = np.full(len(series), -1, dtype=np.int64)
    if all(isinstance(level, (int, float)) for level in col.levels):
        numeric = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64)
        for i, level in enumerate(col.levels):
            codes[numeric == float(level)] = i
    else:
        text = series.astype(str).to_numpy()
        for i, level in enumerate(col.levels):
            codes[text == str(level)] = i
    return codes


def _levels_array(col: Column) -> np.ndarray:
    return np.array(col.levels)
