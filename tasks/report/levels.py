"""Levels of binary and categorical columns that vanished (share 0) from generated samples.

A level that a generator stops producing is the first sign of mode collapse; the internal report
warns about every one, those at a chosen checkpoint first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import SupportsInt

import pandas as pd

from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.quality import level_frequencies
from dpsynth.tasks.report.document import Table
from dpsynth.tasks.report.formatting import format_number, iteration_label

# Optional per-run level-share columns in the results table: "share:<column>=<level>".
SHARE_PREFIX = "share:"


def flatten_level_shares(level_shares: dict[str, dict[str, float]]) -> dict[str, float]:
    """{column: {level: share}} as results-table columns {"share:<column>=<level>": share}."""
    return {
        f"{SHARE_PREFIX}{col}={level}": float(share)
        for col, levels in level_shares.items()
        for level, share in levels.items()
    }


def normalise_chosen(chosen: Mapping[str, Mapping[str, object] | pd.Series | None] | None) -> dict[str, dict]:
    """{setting: plain dict} from dicts or pandas Series (as `choose_checkpoint` returns); drops None."""
    out = {}
    for setting, entry in (chosen or {}).items():
        if entry is None or (isinstance(entry, dict) and not entry):
            continue
        out[str(setting)] = {str(k): v for k, v in dict(entry.items()).items()}
    return out


def chosen_iteration(chosen: dict, setting: str) -> int | None:
    entry = chosen.get(setting) or {}
    it = entry.get("iteration")
    return None if it is None or (isinstance(it, float) and math.isnan(it)) else int(it)


def vanished_levels(
    schema: DatasetSchema, ledger_level_shares: dict, chosen: dict | None = None, results: pd.DataFrame | None = None
) -> list[dict]:
    """Every (setting, iteration, column, level) whose share is 0 at a checkpoint.

    Sources: the ledger's per-checkpoint level shares (generated samples, DP-covered) and optional
    "share:<column>=<level>" columns of the results table. A declared level missing from a column's
    recorded shares counts as 0. Each finding: dict(setting, iteration, column, level, chosen, source).
    """
    chosen = normalise_chosen(chosen)
    found: dict[tuple, dict] = {}

    def add(setting: str, iteration: SupportsInt, column: str, level: object, source: str) -> None:
        key = (setting, int(iteration), column, str(level))
        if key not in found:
            found[key] = {
                "setting": setting,
                "iteration": int(iteration),
                "column": column,
                "level": str(level),
                "chosen": chosen_iteration(chosen, setting) == int(iteration),
                "source": source,
            }

    for setting, entries in (ledger_level_shares or {}).items():
        for entry in entries or []:
            shares = entry.get("level_shares") or {}
            for col in schema.discrete:
                if col.name not in shares:
                    continue
                for level in col.levels:
                    value = shares[col.name].get(str(level), 0.0)
                    if value is None or float(value) <= 0.0:
                        add(setting, entry["iteration"], col.name, level, "ledger")
    if results is not None and not results.empty:
        share_columns = [c for c in results.columns if str(c).startswith(SHARE_PREFIX)]
        for column in share_columns:
            name, _, level = str(column)[len(SHARE_PREFIX) :].partition("=")
            zero = results[pd.to_numeric(results[column], errors="coerce") <= 0.0]
            for _, row in zero.iterrows():
                add(row["setting"], row["iteration"], name, level, "results")
    return sorted(
        found.values(), key=lambda f: (not f["chosen"], str(f["setting"]), f["column"], f["level"], f["iteration"])
    )


def level_warnings(
    schema: DatasetSchema,
    ledger_level_shares: dict,
    chosen: dict | None = None,
    results: pd.DataFrame | None = None,
    synthetic_frames: dict[str, pd.DataFrame] | None = None,
) -> list[str]:
    """One WARNING line per vanished level: first those at a chosen checkpoint, then one line per
    (setting, column, level) listing the checkpoints, then levels absent from a synthetic table."""
    findings = vanished_levels(schema, ledger_level_shares, chosen, results)
    lines = [
        f"WARNING (CHOSEN CHECKPOINT): setting {f['setting']}, iteration {f['iteration']}: level "
        f"{f['level']!r} of column {f['column']!r} vanished (share 0)."
        for f in findings
        if f["chosen"]
    ]
    grouped: dict[tuple, list[int]] = {}
    for f in findings:
        grouped.setdefault((f["setting"], f["column"], f["level"]), []).append(f["iteration"])
    for (setting, column, level), iterations in grouped.items():
        iterations = sorted(set(iterations))
        lines.append(
            f"WARNING: setting {setting}: level {level!r} of column {column!r} vanished (share 0) at "
            f"{len(iterations)} checkpoint(s): iterations {', '.join(map(str, iterations))}."
        )
    for setting, frame in (synthetic_frames or {}).items():
        for column, shares in level_frequencies(schema, frame).items():
            for level, share in shares.items():
                if share <= 0.0:
                    lines.append(
                        f"WARNING: the synthetic table of setting {setting} has no row with level "
                        f"{level!r} of column {column!r}."
                    )
    return lines


def level_share_table(schema: DatasetSchema, entries: list[dict], chosen_at: int | None) -> Table:
    """One row per checkpoint, one column per declared level; vanished levels highlighted."""
    keys = [(col.name, str(level)) for col in schema.discrete for level in col.levels]
    header = ["iteration"] + [f"{c}={lvl}" for c, lvl in keys]
    rows, highlight = [], set()
    for i, entry in enumerate(sorted(entries, key=lambda e: e["iteration"])):
        shares = entry.get("level_shares") or {}
        label = iteration_label(entry["iteration"], entry.get("epsilon")) + (
            " (chosen)" if entry["iteration"] == chosen_at else ""
        )
        row = [label]
        for j, (column, level) in enumerate(keys):
            if column not in shares:
                row.append("")
                continue
            value = shares[column].get(level, 0.0)
            value = 0.0 if value is None else float(value)
            row.append(format_number(value, 3))
            if value <= 0.0:
                highlight.add((i, j + 1))
        rows.append(row)
    return Table(header, rows, highlight)
