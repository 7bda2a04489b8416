"""How numbers and tables of numbers read in both documents (fixed digits, 'inf', '' for missing)."""

from __future__ import annotations

import math
from typing import SupportsFloat

import numpy as np
import pandas as pd

from dpsynth.tasks.report.document import Table


def format_number(value: object, digits: int = 4) -> str:
    """Fixed-point text for a number: '' for missing, 'inf' for infinity, integers as they are."""
    if value is None:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value):
            return ""
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.{digits}f}"
    return str(value)


def format_general(value: object) -> str:
    """A finite float in its shortest form (1e-05, 1.07), anything else as `format_number` writes it."""
    if isinstance(value, (float, np.floating)) and math.isfinite(value):
        return f"{float(value):g}"
    return format_number(value)


def is_finite(value: SupportsFloat | str | None) -> bool:
    """Whether `value` reads as a finite number (None, NaN, infinities and other text do not)."""
    if value is None:
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def frame_table(
    frame: pd.DataFrame, digits: int | dict[str, int] = 4, index: bool = True, caption: str = "", index_name: str = ""
) -> Table:
    """A DataFrame as a table; `digits` per column when a dict (4 for columns it does not name)."""
    header = ([index_name or (frame.index.name or "")] if index else []) + [str(c) for c in frame.columns]
    rows = []
    for label, values in zip(frame.index, frame.itertuples(index=False), strict=False):
        row = [str(label)] if index else []
        for column, value in zip(frame.columns, values, strict=False):
            d = digits.get(column, 4) if isinstance(digits, dict) else digits
            row.append(format_number(value, d))
        rows.append(row)
    return Table(header, rows, caption=caption)


def mapping_table(mapping: dict, key_header: str = "item", value_header: str = "value") -> Table:
    """A dict as a table: scalars as key/value rows, a dict of dicts as one row per key."""
    if mapping and all(isinstance(v, dict) for v in mapping.values()):
        frame = pd.DataFrame.from_dict(mapping, orient="index")
        frame = frame.astype(object).where(frame.notna(), None)
        return frame_table(frame, digits=4, index_name=key_header)
    rows = [
        [str(k), format_general(v) if not isinstance(v, (list, tuple)) else ", ".join(map(format_general, v))]
        for k, v in mapping.items()
    ]
    return Table([key_header, value_header], rows)


# The checkpoint saved before the first training step: its generator has seen no row through training, so
# its epsilon is only what was spent before training (0, or the measured marginals its rows are calibrated
# to), and its AUC can lie above trained checkpoints'.
UNTRAINED_ITERATION = 0


def _finite(value: object) -> float | None:
    if isinstance(value, (int, float, np.integer, np.floating, str)) and is_finite(value):
        return float(value)
    return None


def untrained_label(epsilon: object = None) -> str:
    """How the documents name the untrained checkpoint: "untrained (epsilon 0)", or with its epsilon when
    something was spent before training."""
    spent = _finite(epsilon)
    if spent is None or spent == 0.0:
        return "untrained (epsilon 0)"
    return f"untrained (epsilon {format_general(round(spent, 3))})"


def is_untrained(iteration: object) -> bool:
    number = _finite(iteration)
    return number is not None and int(number) == UNTRAINED_ITERATION


def iteration_label(iteration: object, epsilon: object = None) -> str:
    """A checkpoint's iteration as a table cell: the untrained one says so ("0, untrained (epsilon 0)")."""
    return f"0, {untrained_label(epsilon)}" if is_untrained(iteration) else format_number(iteration)
