"""One Great Expectations suite result for a table validated chunk by chunk (its Parquet row groups, or
a CSV read in chunks), equal in what validation reads from it to the result on the whole table.

Each expectation of the suite `validate.build_suite` writes is combined by what it measures:

- a column map (values in a type list, between bounds, in a set, not null): its counts (elements,
  missing, unexpected) add up over the chunks, and it succeeds when every chunk does;
- the table's row count and a column's proportion of non-null values are not decomposable as verdicts
  (a chunk of one row has too few rows; a column missing in one chunk is not missing in the table): their
  counts add up and the verdict is judged once, on the totals;
- a column's existence is the same in every chunk (one header).

The type check is a column map only on an ``object`` column (text among numbers): a chunk whose column
parsed as numbers is checked by its dtype alone, so its counts are taken from the chunk itself, as the
whole table's object column would have counted them. An expectation that raised in any chunk raised on
the table (text among numbers in a between check). Any other expectation type (uniqueness, a mean) is
refused with a message rather than combined wrongly.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pandas as pd

from dpsynth.models.errors import ConfigError

ROW_COUNT = "expect_table_row_count_to_be_between"
NON_NULL_PROPORTION = "expect_column_proportion_of_non_null_values_to_be_between"
COLUMN_EXISTS = "expect_column_to_exist"
TYPE_LIST = "expect_column_values_to_be_in_type_list"
COLUMN_MAPS = {
    TYPE_LIST,
    "expect_column_values_to_be_between",
    "expect_column_values_to_be_in_set",
    "expect_column_values_to_not_be_null",
}
COMBINABLE = {ROW_COUNT, NON_NULL_PROPORTION, COLUMN_EXISTS} | COLUMN_MAPS
COUNTS = ("element_count", "missing_count", "unexpected_count")
# GX's SUMMARY format lists at most 20 unexpected values (internal storage only).
PARTIAL_LIST_LENGTH = 20


def combinable_types(results: list[dict]) -> None:
    """Refuse a suite with an expectation this module cannot combine over chunks."""
    other = sorted({r["expectation_config"]["type"] for r in results} - COMBINABLE)
    if other:
        raise ConfigError(
            "The expectation suite holds expectations that cannot be checked one row group at a time "
            f"({', '.join(other)}); tables larger than one chunk are validated in chunks."
        )


class SuiteResultSum:
    """The running combination of a suite's JSON results (`ExpectationSuiteValidationResult.to_json_dict`)
    over the chunks of one table, folded one chunk at a time: memory does not grow with the chunks."""

    def __init__(self) -> None:
        self.rows = 0
        self.chunks = 0
        self._first: dict[str, Any] | None = None
        self._results: list[dict] = []
        self._non_null: dict[int, int] = {}  # result index -> non-null values (proportion checks)
        self._dtype_only: dict[int, dict] = {}  # type checks judged by dtype: dtypes and counts

    def add(self, result: dict, chunk: pd.DataFrame) -> None:
        # GX lists the results in no fixed order: each is matched to the first chunk's by its expectation.
        order = {_identity(res): i for i, res in enumerate(self._results)}
        rows = len(chunk)
        if self._first is None:
            self._first = result
            self._results = copy.deepcopy(result["results"])
            order = {_identity(res): i for i, res in enumerate(self._results)}
            results = result["results"]
        else:
            if self.chunks == 1:
                combinable_types(self._results)
            results = sorted(result["results"], key=lambda res: order[_identity(res)])
            self._merge(results)
        for i, res in enumerate(results):
            kind, column = _kind(res), _column(res)
            if kind == NON_NULL_PROPORTION and column in chunk.columns:
                self._non_null[i] = self._non_null.get(i, 0) + int(chunk[column].notna().sum())
            if kind == TYPE_LIST and column in chunk.columns:
                self._note_type_check(i, res, chunk[column])
        self.rows += rows
        self.chunks += 1

    def _note_type_check(self, i: int, res: dict, values: pd.Series) -> None:
        detail = res.get("result") or {}
        if "unexpected_count" in detail or _raised(res):
            return
        # Judged by dtype: the counts an object column's value-by-value check would have given.
        noted = self._dtype_only.setdefault(i, {"dtypes": [], **dict.fromkeys(COUNTS, 0)})
        noted["dtypes"].append(str(detail.get("observed_value")))
        noted["element_count"] += len(values)
        noted["missing_count"] += int(values.isna().sum())
        noted["unexpected_count"] += 0 if res["success"] else len(values)

    def _merge(self, results: list[dict]) -> None:
        for acc, res in zip(self._results, results, strict=True):
            if _raised(acc):
                continue
            if _raised(res):
                acc.clear()
                acc.update(copy.deepcopy(res))
                continue
            acc["success"] = bool(acc["success"] and res["success"])
            mine, theirs = acc.setdefault("result", {}), res.get("result") or {}
            if "unexpected_count" in theirs and "unexpected_count" not in mine:
                mine.update({key: 0 for key in COUNTS})
                mine["partial_unexpected_list"] = []
                mine.pop("observed_value", None)
            for key in COUNTS:
                if key in theirs and key in mine:
                    mine[key] += theirs[key]
            if "partial_unexpected_list" in theirs:
                room = PARTIAL_LIST_LENGTH - len(mine.get("partial_unexpected_list", []))
                mine.setdefault("partial_unexpected_list", []).extend(theirs["partial_unexpected_list"][: max(room, 0)])

    def result(self, min_rows: int) -> dict:
        """The combined result; on one chunk, GX's own."""
        if self._first is None:
            raise ValueError("no chunk was added")
        if self.chunks == 1:
            return self._first
        results = self._results
        for i, res in enumerate(results):
            kind = _kind(res)
            if _raised(res):
                continue
            detail = res.setdefault("result", {})
            if kind == ROW_COUNT:
                detail["observed_value"] = self.rows
                res["success"] = _between(self.rows, res["expectation_config"]["kwargs"], min_rows)
            elif kind == NON_NULL_PROPORTION and i in self._non_null:
                share = self._non_null[i] / self.rows
                detail["observed_value"] = share
                res["success"] = _between(share, res["expectation_config"]["kwargs"], min_rows)
            elif kind == TYPE_LIST and i in self._dtype_only:
                noted = self._dtype_only[i]
                if "unexpected_count" in detail:  # some chunk held text: the whole column was checked by value
                    for key in COUNTS:
                        detail[key] += noted[key]
                else:
                    detail["observed_value"] = _widest(noted["dtypes"])
            if "unexpected_count" in detail:
                _percentages(detail)
        successes = sum(bool(r["success"]) for r in results)
        combined = copy.deepcopy({k: v for k, v in self._first.items() if k != "results"})
        combined.update(
            success=successes == len(results),
            results=results,
            statistics={
                "evaluated_expectations": len(results),
                "successful_expectations": successes,
                "unsuccessful_expectations": len(results) - successes,
                "success_percent": successes / len(results) * 100 if results else None,
            },
        )
        return combined


def _identity(res: dict) -> str:
    config = res["expectation_config"]
    return json.dumps([config["type"], config.get("kwargs", {})], sort_keys=True)


def _kind(res: dict) -> str:
    return res["expectation_config"]["type"]


def _column(res: dict) -> str | None:
    return res["expectation_config"].get("kwargs", {}).get("column")


def _raised(res: dict) -> bool:
    info = res.get("exception_info") or {}
    if info.get("raised_exception"):
        return True
    return any(isinstance(v, dict) and v.get("raised_exception") for v in info.values())


def _between(value: float, kwargs: dict, min_rows: int) -> bool:
    """GX's between verdict on an observed value (the row floor is the suite's one parameter)."""

    def bound(raw: Any) -> Any:
        return min_rows if isinstance(raw, dict) else raw

    low, high = bound(kwargs.get("min_value")), bound(kwargs.get("max_value"))
    if low is not None and (value <= low if kwargs.get("strict_min") else value < low):
        return False
    return not (high is not None and (value >= high if kwargs.get("strict_max") else value > high))


def _widest(dtype_names: list[str]) -> str:
    """The dtype the whole column would have had (int64 beside float64 chunks: float64), GX's name for it."""
    try:
        return np.result_type(*[np.dtype(name) for name in dtype_names]).type.__name__
    except TypeError:
        return dtype_names[0]


def _percentages(detail: dict) -> None:
    elements, unexpected = detail.get("element_count", 0), detail["unexpected_count"]
    missing = detail.get("missing_count", 0)  # a not-null check counts the gaps as unexpected instead
    present = elements - missing
    if "missing_count" in detail:
        detail["missing_percent"] = 100.0 * missing / elements if elements else None
    detail["unexpected_percent"] = 100.0 * unexpected / present if present else None
    detail["unexpected_percent_total"] = 100.0 * unexpected / elements if elements else None
    detail["unexpected_percent_nonmissing"] = detail["unexpected_percent"]
