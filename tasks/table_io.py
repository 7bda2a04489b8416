"""Reading and writing tables: CSV (with the schema's separator) or Parquet.

Every way an input file can be unusable becomes a `MissingInputError` or an `InvalidTableError` with a
message a user can act on; no pandas or pyarrow traceback reaches the user. Messages name files, columns
and line numbers, never cell values (the table is sensitive).

Declared columns are read so that validation, not the reader, judges their contents: a column whose
every value parses as a number becomes numeric; one holding text keeps that text next to the parsed
numbers (object dtype), so the suite can count the offending rows.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.models.errors import InvalidTableError, MissingInputError

PARQUET_SUFFIXES = (".parquet", ".pq")
PARQUET_MAGIC = b"PAR1"
_SEPARATORS = (",", ";", "\t", "|")
_SNIFF_BYTES = 64 * 1024


def _separator_name(sep: str) -> str:
    return "TAB" if sep == "\t" else repr(sep)


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_parquet(path: str | Path) -> bool:
    """A Parquet file by its extension, or by its leading magic bytes."""
    path = Path(path)
    if path.suffix.lower() in PARQUET_SUFFIXES:
        return True
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == PARQUET_MAGIC
    except OSError:
        return False


def read_table(path: str | Path, schema: DatasetSchema) -> pd.DataFrame:
    """Read the table at `path` as declared by `schema` (CSV with `schema.separator`, or Parquet).

    Raises `MissingInputError` when there is no such file and `InvalidTableError` when the file is not a
    readable table (empty, header only, wrong separator, binary, duplicated column names, ragged rows).
    Whether the contents conform to the schema is for `dpsynth.tasks.validate` to judge.
    """
    path = _readable_file(path)
    if is_parquet(path):
        df = _read_parquet(path)
    else:
        df = _read_csv(path, schema)
    if len(df) == 0:
        raise InvalidTableError(_no_rows(path))
    return normalize_columns(df, schema)


def iter_table(path: str | Path, schema: DatasetSchema, chunk_rows: int) -> Iterator[pd.DataFrame]:
    """`read_table` in chunks of at most `chunk_rows` rows, each normalised on its own (`normalize_column`):
    what validation reads when the table need not fit in memory. The same refusals as `read_table`, some
    raised only when the chunk that shows them is reached (a ragged row far down a CSV)."""
    path = _readable_file(path)
    chunks = _iter_parquet(path, chunk_rows) if is_parquet(path) else _iter_csv(path, schema, chunk_rows)
    any_rows = False
    for chunk in chunks:
        if len(chunk):
            any_rows = True
            yield normalize_columns(chunk, schema)
    if not any_rows:
        raise InvalidTableError(_no_rows(path))


def _readable_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise MissingInputError(f"The input table {str(path)!r} does not exist.")
    if not path.is_file():
        raise MissingInputError(f"The input table {str(path)!r} is not a file.")
    if path.stat().st_size == 0:
        raise InvalidTableError(f"The input table {str(path)!r} is empty (0 bytes): it has no header and no rows.")
    return path


def _no_rows(path: Path) -> str:
    return f"The input table {str(path)!r} has a header but no rows: there is nothing to synthesise from."


def write_table(df: pd.DataFrame, path: str | Path, separator: str = ",") -> Path:
    """Write `df` without its index as Parquet (.parquet/.pq) or CSV (any other suffix, with `separator`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() in PARQUET_SUFFIXES:
        df.to_parquet(path, index=False)
    else:
        df.to_csv(path, sep=separator, index=False)
    return path


# --------------------------------------------------------------------------------------------- CSV


def _read_csv(path: Path, schema: DatasetSchema) -> pd.DataFrame:
    _check_csv(path, schema)
    with _csv_errors(path, schema.separator):
        return pd.read_csv(path, **_csv_options(schema))


def _iter_csv(path: Path, schema: DatasetSchema, chunk_rows: int) -> Iterator[pd.DataFrame]:
    _check_csv(path, schema)
    with _csv_errors(path, schema.separator):
        with pd.read_csv(path, chunksize=chunk_rows, **_csv_options(schema)) as reader:
            yield from reader


def _csv_options(schema: DatasetSchema) -> dict:
    return {
        "sep": schema.separator,
        "dtype": str,
        "encoding": "utf-8-sig",
        "skipinitialspace": True,
        "engine": "c",
        # A quoted field may span lines, so "no rows" is judged on the parsed result, not line count.
    }


def _check_csv(path: Path, schema: DatasetSchema) -> None:
    """The refusals judged before any row is parsed: binary or non-UTF-8 bytes, the header."""
    sep = schema.separator
    where = str(path)
    with open(path, "rb") as handle:
        head = handle.read(_SNIFF_BYTES)
    if b"\x00" in head:
        raise InvalidTableError(
            f"The input table {where!r} is a binary file, not a text table "
            f"(expected CSV separated by {_separator_name(sep)} or Parquet)."
        )
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the end of the sniffed block is not an error.
        if exc.start < len(head) - 4:
            raise InvalidTableError(
                f"The input table {where!r} is not UTF-8 text (undecodable byte at offset {exc.start}); "
                f"expected CSV separated by {_separator_name(sep)} or Parquet."
            ) from None

    header = _read_header(path, sep)
    if not header or header == [""]:
        raise InvalidTableError(f"The input table {where!r} has an empty first line: expected a header row.")
    _check_separator(header, schema, where)
    _check_duplicates(header, where)


@contextmanager
def _csv_errors(path: Path, sep: str) -> Iterator[None]:
    """pandas' parsing errors as `InvalidTableError`s that name the file, never a cell value."""
    where = str(path)
    try:
        yield
    except UnicodeDecodeError as exc:
        raise InvalidTableError(
            f"The input table {where!r} is not UTF-8 text (undecodable byte at offset {exc.start})."
        ) from None
    except pd.errors.EmptyDataError:
        raise InvalidTableError(f"The input table {where!r} holds no columns and no rows.") from None
    except pd.errors.ParserError as exc:
        raise InvalidTableError(
            f"The input table {where!r} cannot be parsed as a table separated by {_separator_name(sep)}: "
            f"{_first_line(exc)}"
        ) from None
    except (ValueError, OSError) as exc:
        raise InvalidTableError(f"The input table {where!r} cannot be read as CSV: {_first_line(exc)}") from None


def _read_header(path: Path, sep: str) -> list[str]:
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as handle:
        reader = csv.reader(handle, delimiter=sep)
        try:
            return [name.strip() for name in next(reader)]
        except StopIteration:
            return []
        except csv.Error as exc:
            raise InvalidTableError(f"The header of {str(path)!r} cannot be parsed: {exc}") from None


def _check_separator(header: list[str], schema: DatasetSchema, where: str) -> None:
    """A header that parsed into one column holding another separator: the wrong separator."""
    if len(header) != 1 or len(schema.columns) < 2:
        return
    declared = schema.separator
    for other in _SEPARATORS:
        if other != declared and other in header[0]:
            raise InvalidTableError(
                f"The input table {where!r} seems to use {_separator_name(other)} as separator but the "
                f"schema declares {_separator_name(declared)}: its header parsed into a single column. "
                f"Convert the file or set 'separator' in the schema."
            )
    raise InvalidTableError(
        f"The input table {where!r} has a single column {header[0]!r} with the declared separator "
        f"{_separator_name(declared)}, but the schema declares {len(schema.columns)} columns."
    )


def _check_duplicates(names: list[str], where: str) -> None:
    seen: set[str] = set()
    duplicated: list[str] = []
    for name in names:
        if name in seen and name not in duplicated:
            duplicated.append(name)
        seen.add(name)
    if duplicated:
        raise InvalidTableError(
            f"The input table {where!r} has duplicated column names: {', '.join(map(repr, duplicated))}. "
            f"Each column must appear once."
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ----------------------------------------------------------------------------------------- Parquet


def _read_parquet(path: Path) -> pd.DataFrame:
    import pyarrow.parquet as pq

    _check_parquet(path)
    with _parquet_errors(path):
        df = pq.read_table(path).to_pandas()
    df.columns = [str(c) for c in df.columns]
    return df


def _iter_parquet(path: Path, chunk_rows: int) -> Iterator[pd.DataFrame]:
    import pyarrow.parquet as pq

    _check_parquet(path)
    with _parquet_errors(path):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=chunk_rows):
            df = batch.to_pandas()
            df.columns = [str(c) for c in df.columns]
            yield df


def _check_parquet(path: Path) -> None:
    import pyarrow.parquet as pq

    with _parquet_errors(path):
        names = pq.read_schema(path).names
    _check_duplicates([str(n) for n in names], str(path))


@contextmanager
def _parquet_errors(path: Path) -> Iterator[None]:
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
        raise InvalidTableError(
            f"The input table {str(path)!r} is not a readable Parquet file: {_first_line(exc)}"
        ) from None


# ----------------------------------------------------------------------------------- column types


def _numeric_levels(column: Column) -> bool:
    return all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in column.levels)


def normalize_column(series: pd.Series, column: Column) -> pd.Series:
    """Give a declared column the type validation expects, keeping unparsable values as they are.

    Continuous columns, and discrete ones with numeric levels, become numeric when every present value
    parses as a number; otherwise the parsed numbers and the unparsable text sit side by side in an
    object column, which the suite's type and level checks count row by row. Discrete columns with text
    levels become object columns of stripped strings.
    """
    if column.kind == "continuous" or _numeric_levels(column):
        if pd.api.types.is_bool_dtype(series.dtype):
            return series.astype("int64")
        if pd.api.types.is_numeric_dtype(series.dtype):
            if isinstance(series.dtype, pd.api.extensions.ExtensionDtype):  # Int64, Float64, ...
                return series.astype("float64" if series.isna().any() else series.dtype.numpy_dtype)
            return series
        text = series.astype(object)
        parsed = pd.to_numeric(text, errors="coerce")
        present = text.notna() & (text.astype(str).str.strip() != "")
        bad = present & parsed.isna()
        if not bad.any():
            parsed = parsed.where(present)
            if parsed.dtype.kind not in "if":  # e.g. integers beyond int64, parsed as objects
                parsed = parsed.astype("float64")
            # Infinity and 1e300 equal their floor but are no int64: such a column stays float (and then
            # fails the levels check) instead of raising in the cast.
            whole = np.isfinite(parsed).all() and (parsed.abs() < 2**63).all() and (parsed == np.floor(parsed)).all()
            if whole and column.kind != "continuous":
                return parsed.astype("int64")
            return parsed
        mixed = parsed.astype(object)
        mixed[bad] = text[bad]
        mixed[~present] = np.nan
        return mixed
    out = series.astype(object)
    present = out.notna()
    out[present] = out[present].map(lambda v: str(v).strip())
    return out


def normalize_columns(df: pd.DataFrame, schema: DatasetSchema) -> pd.DataFrame:
    """`normalize_column` for every declared column present in `df`; other columns are left as they are."""
    out = df.copy()
    for column in schema.columns:
        if column.name in out.columns:
            out[column.name] = normalize_column(out[column.name], column)
    return out


def read_for_draft(path: str | Path) -> tuple[pd.DataFrame, str]:
    """The table at `path` for `dpsynth schema draft`, and its CSV separator (the one of , ; TAB | that
    splits the header into most columns; ',' for Parquet). A draft takes only column names and dtypes:
    Parquet's are read from the file's metadata (no value is read); a CSV's are what pandas parses, so a
    numeric column holding one text value is drafted as text: the steward reviews every kind."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"The table {str(path)!r} does not exist.")
    if is_parquet(path):
        import pyarrow.parquet as pq

        try:
            return pq.read_schema(path).empty_table().to_pandas(), ","
        except Exception as exc:  # pyarrow's many error types: one readable message
            raise InvalidTableError(f"The table {str(path)!r} cannot be read as Parquet: {_first_line(exc)}") from None
    counts = {sep: len(_read_header(path, sep)) for sep in _SEPARATORS}
    separator = max(_SEPARATORS, key=lambda sep: counts[sep])  # ties keep the earlier: ',' first
    if counts[separator] == 0 or _read_header(path, separator) == [""]:
        raise InvalidTableError(f"The table {str(path)!r} has an empty first line: expected a header row.")
    _check_duplicates(_read_header(path, separator), str(path))
    try:
        frame = pd.read_csv(path, sep=separator, encoding="utf-8-sig", skipinitialspace=True, engine="c")
    except (UnicodeDecodeError, ValueError, pd.errors.ParserError) as exc:
        raise InvalidTableError(f"The table {str(path)!r} cannot be read as CSV: {_first_line(exc)}") from None
    return frame, separator
