"""The training rows' exact cell counts, in one pass over the validated table's Parquet row groups, in
this process or on a Dask cluster's workers (dpsynth.models.data.cell_counts says what is counted).

A marginal generator (MST, AIM) reads its training rows only through such counts, so the prepare stage
counts them here instead of building the n x width training matrix: each row group is read alone, its
training rows (the split's, by global row index) go through exactly the steps `training.training_matrix`
takes for a generator whose rows impute nothing from each other (invalid values to missing, each gap the
middle of its public range, encoded to float32 and decoded back), and only the counts are kept. Every
step is row-local, so the counts equal those of the whole matrix, bit for bit.

With `cluster` (a Dask scheduler's address, `dpsynth release --cluster`), each row group is counted by a
worker, which must read the same Parquet path (shared storage); the exact counts come back and are summed
here. The privacy secret never leaves this process (it cannot be pickled): the noise is drawn from it by
the generator after the sum, so a cluster and one process release the same numbers for the same secret.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth.models.data.cell_counts import CellCounts, Clique, add_up, count_frame
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.preprocessing import UnitScaledImputer, invalid_to_missing, typed_frame
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.tasks.cluster import ClusterMap

# Rows per row group of the validated table's Parquet file: the unit one counting step holds in memory
# (about 50 MB of frames for a census-width table) and the unit of work of a cluster's workers.
ROW_GROUP_ROWS = 65_536


def publicly_filled_rows(schema: DatasetSchema, frame: pd.DataFrame, knn_neighbors: int) -> pd.DataFrame:
    """The decoded training values of `frame`'s rows as the generator sees them when no row imputes
    another: invalid values missing, each gap the middle of its public range, encoded (float32) and
    decoded back (the decoding's rounding included)."""
    numeric, _ = invalid_to_missing(schema, frame)
    filled = UnitScaledImputer(schema, knn_neighbors).fill_public(numeric)
    encoder = TableEncoder(schema)
    return encoder.decode(encoder.encode(typed_frame(schema, filled)).astype(np.float32))


def row_group_layout(table_path: Path) -> list[tuple[int, int]]:
    """(first row, rows) of each row group of a Parquet file, from its footer alone."""
    import pyarrow.parquet as pq

    metadata = pq.ParquetFile(table_path).metadata
    layout, first = [], 0
    for i in range(metadata.num_row_groups):
        rows = metadata.row_group(i).num_rows
        layout.append((first, rows))
        first += rows
    return layout


def read_rows(table_path: Path, rows: np.ndarray) -> pd.DataFrame:
    """The table's rows `rows` (sorted global indices), read one row group at a time: memory for those
    rows only, never the whole table; indexed by their global indices."""
    import pyarrow.parquet as pq

    rows = np.sort(np.asarray(rows, dtype=np.int64))
    parquet = pq.ParquetFile(table_path)
    pieces = []
    for group, (first, n) in enumerate(row_group_layout(table_path)):
        lo, hi = np.searchsorted(rows, [first, first + n])
        if hi > lo:
            piece = parquet.read_row_group(group).to_pandas().iloc[rows[lo:hi] - first]
            pieces.append(piece.set_axis(rows[lo:hi]))
    if not pieces:
        return parquet.schema_arrow.empty_table().to_pandas()
    return pd.concat(pieces)


def write_public_training_matrix(
    schema: DatasetSchema, table_path: Path, rows: np.ndarray, knn_neighbors: int, out: Path
) -> None:
    """The encoded training rows `rows` (global indices, kept in their order) when no row imputes another
    (`publicly_filled_rows`' values before decoding), written to the .npy file `out` one row group at a
    time: the same array as the in-memory `training.training_matrix`, without the table in memory."""
    import pyarrow.parquet as pq

    rows = np.asarray(rows, dtype=np.int64)
    encoder = TableEncoder(schema)
    matrix = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(len(rows), encoder.width))
    order = np.argsort(rows, kind="stable")
    ascending = rows[order]
    parquet = pq.ParquetFile(table_path)
    for group, (first, n) in enumerate(row_group_layout(table_path)):
        lo, hi = np.searchsorted(ascending, [first, first + n])
        if hi > lo:
            frame = parquet.read_row_group(group).to_pandas().iloc[ascending[lo:hi] - first]
            numeric, _ = invalid_to_missing(schema, frame)
            filled = UnitScaledImputer(schema, knn_neighbors).fill_public(numeric)
            matrix[order[lo:hi]] = encoder.encode(typed_frame(schema, filled)).astype(np.float32)
    matrix.flush()
    del matrix


def count_row_group(
    table_path: str,
    group: int,
    local_rows: np.ndarray,
    schema: DatasetSchema,
    knn_neighbors: int,
    bins: int,
    cliques: Sequence[Clique],
    fine: Sequence[int],
    reader: str,
) -> CellCounts:
    """The counts of the rows `local_rows` (positions inside row group `group`) of the table."""
    import pyarrow.parquet as pq

    frame = pq.ParquetFile(table_path).read_row_group(group).to_pandas()
    values = publicly_filled_rows(schema, frame.iloc[local_rows], knn_neighbors)
    return count_frame(values, tuple(schema.columns), bins, cliques, fine, reader=reader)


def count_training_cells(
    schema: DatasetSchema,
    table_path: Path,
    rows: np.ndarray,
    knn_neighbors: int,
    bins: int,
    cliques: Sequence[Clique],
    fine: Sequence[int] = (),
    reader: str = "the marginal generators",
    cluster: str | None = None,
) -> CellCounts:
    """The exact counts of the table's rows `rows` (global indices), one row group at a time, here or on
    the Dask cluster at `cluster` (see the module notes)."""
    rows = np.sort(np.asarray(rows, dtype=np.int64))
    jobs = []
    for group, (first, n) in enumerate(row_group_layout(table_path)):
        lo, hi = np.searchsorted(rows, [first, first + n])
        if hi > lo:
            jobs.append((group, rows[lo:hi] - first))
    columns = tuple(schema.columns)
    arguments = (schema, knn_neighbors, bins, list(cliques), list(fine), reader)
    if cluster is None:
        parts = (count_row_group(str(table_path), group, local, *arguments) for group, local in jobs)
        return add_up(parts, columns, bins, cliques, fine)
    # Each row group's exact counts on the cluster's workers, summed here.
    counted = ClusterMap(cluster)(
        count_row_group, [(str(table_path), group, local, *arguments) for group, local in jobs]
    )
    return add_up(counted, columns, bins, cliques, fine)
