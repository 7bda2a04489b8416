"""The encoded training rows a DP-SGD trainer reads: its Poisson batches and, for a one-off query, every
row in chunks, from an array in memory or from the prepare stage's `train_rows.npy` on disk.

A trainer that held the whole matrix held 4 bytes per encoded value and row (345 MB for `eps1` at
1,000,000 census rows, 3.5 GB at 10,000,000), though a step reads only its Poisson batch (a share q of
the rows) and the one-off queries (DP-auto-GAN's Gaussian fit and moment query) read the rows once, in
order. Given the file (a read-only memory map of it, as the train stage hands it over), `TrainingRows`
reads just the rows asked for with positioned reads (models/data/npy_rows.py), so what the process
holds is the batch, not the file.

The rows read are the same values in the same order either way, so a fixed secret trains the same
weights from the file as from an array (a test checks it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from dpsynth.models.data.npy_rows import RowFile


class TrainingRows:
    """Rows of an `n x width` float32 matrix (or some of its columns), read as float32 tensors.

    `rows[index]` with a tensor or array of positions: those rows; `rows[start:stop]`: a contiguous run;
    `rows.columns(c)`: a view of some columns, read the same ways; `rows.shape`, `len(rows)`. A memory map
    of a `.npy` file (`np.load(path, mmap_mode="r")`) is read from its file; anything else is held as one
    tensor, indexed directly."""

    def __init__(self, source: np.ndarray | torch.Tensor | TrainingRows, columns: Sequence[int] | None = None):
        self._source: RowFile | torch.Tensor
        self._columns: list[int] | None
        if isinstance(source, TrainingRows):
            self._source, columns = source._source, _compose(source._columns, columns)
        elif isinstance(source, np.memmap) and source.filename is not None:
            self._source = RowFile(source.filename)
            if self._source.shape != source.shape or self._source.dtype != np.float32:
                raise ValueError(f"{source.filename}: the training rows are not the whole float32 file")
        else:
            self._source = torch.as_tensor(source, dtype=torch.float32)  # no copy for a float32 array
        self._columns = None if columns is None else list(columns)
        n, width = (int(s) for s in self._source.shape)
        self.shape = torch.Size((n, width if self._columns is None else len(self._columns)))

    @property
    def from_file(self) -> bool:
        """Whether the rows are read from a file (else held in memory)."""
        return isinstance(self._source, RowFile)

    def __len__(self) -> int:
        return self.shape[0]

    def columns(self, columns: Sequence[int]) -> TrainingRows:
        """The same rows, only `columns` (positions among this view's columns), read lazily."""
        return TrainingRows(self, columns)

    def __getitem__(self, index: slice | torch.Tensor | np.ndarray) -> torch.Tensor:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise ValueError("TrainingRows reads contiguous runs of rows (step 1) or positions")
            if isinstance(self._source, RowFile):
                return self._selected(torch.from_numpy(self._source.run(start, stop)))
            return self._selected(self._source[start:stop])
        positions = index.cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
        if positions.dtype == bool or positions.ndim != 1:
            raise ValueError("TrainingRows reads a 1-d array of row positions")
        if isinstance(self._source, RowFile):
            return self._selected(torch.from_numpy(self._source.rows(positions)))
        return self._selected(self._source[torch.as_tensor(positions, dtype=torch.long)])

    def chunks(self, size: int) -> Iterator[torch.Tensor]:
        """Every row, in order, `size` rows at a time (nothing for no rows)."""
        for start in range(0, len(self), size):
            yield self[start : start + size]

    def _selected(self, rows: torch.Tensor) -> torch.Tensor:
        return rows if self._columns is None else rows[:, self._columns]


def _compose(outer: list[int] | None, inner: Sequence[int] | None) -> list[int] | None:
    """Columns `inner` of a view whose columns are `outer`, as columns of the matrix."""
    if inner is None:
        return outer
    return list(inner) if outer is None else [outer[c] for c in inner]
