"""Conditional sampling: rows of a released generator that satisfy {column: value} conditions.

Two ways, both post-processing of the released generator (no privacy cost, every row a row the release
could emit):

* Setting the label: a generator that takes the target's label as an input (GS-WGAN with a condition,
  DP-CGAN) draws rows of one target level directly, when the condition is on the target and the file
  carries no measured marginals. With measured marginals, a released row is a generator row calibrated
  to the noisy marginals (models/marginals/calibration.py), and calibration moves target values to the
  measured target shares: rows drawn with a fixed label and then calibrated would not be the release's
  rows, and rows left uncalibrated would not be its distribution. Those files go by rejection.
* Rejection: batches of ordinary (calibrated) rows, each from its own seed derived from the request's,
  keeping the rows that match, until `n` are found or `MAX_DRAWN_FACTOR * n` rows (at least
  `MIN_DRAWN`) have been drawn; then a ConfigError names the share that matched. Conditions on other
  columns always go this way (after the label is set, when the target is conditioned too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dpsynth.models.errors import ConfigError

if TYPE_CHECKING:
    from dpsynth.models.data.encoding import TableEncoder
    from dpsynth.models.data.schema import DatasetSchema

# Rejection draws at most this many rows per requested row (and at least MIN_DRAWN in all): a condition
# matching fewer than about 1 row in 200 is refused rather than drawn for minutes.
MAX_DRAWN_FACTOR = 200
MIN_DRAWN = 100_000
# The largest batch one draw makes (rows are decoded in memory).
MAX_BATCH = 200_000
# Mixed into each batch's seed, so that batches draw apart from the request's own unconditional rows.
REJECTION_STREAM = 0x5E1EC7


def sample_conditioned(
    sampler: Any, encoder: TableEncoder, n: int, seed: int, conditions: dict[str, Any]
) -> pd.DataFrame:
    """`n` decoded rows satisfying `conditions` (see the module's docstring); the same for the same seed."""
    from dpsynth.models.generators.samplers import conditions_on_target, sample_rows, sample_with_label

    schema = encoder.schema
    checks = {column: _check(schema, column, value) for column, value in conditions.items()}
    label: int | None = None
    if schema.target in conditions and conditions_on_target(sampler) and getattr(sampler, "marginals", None) is None:
        label = list(schema.column(schema.target).levels).index(conditions[schema.target])
        del checks[schema.target]  # set, not checked

    def draw(rows: int, batch_seed: int) -> pd.DataFrame:
        if label is not None:
            return encoder.decode(sample_with_label(sampler, rows, batch_seed, label))
        return sample_rows(sampler, encoder, rows, batch_seed)

    if not checks:
        return draw(n, seed)
    return _by_rejection(draw, checks, n, seed, conditions)


def _check(schema: DatasetSchema, column: str, value: Any) -> Any:
    """A function of a decoded column giving the rows that meet the condition; ConfigError for a condition
    no released row can meet (an unknown column, a level the schema does not list, a range off the bounds)."""
    if column not in schema.column_names:
        raise ConfigError(f"cannot condition on {column!r}: the schema has no such column ({schema.column_names}).")
    col = schema.column(column)
    if col.is_continuous:
        if not (isinstance(value, tuple | list) and len(value) == 2):
            raise ConfigError(
                f"{column!r} is continuous: condition it on a (low, high) range, inclusive, not {value!r}."
            )
        low, high = float(value[0]), float(value[1])
        if low > high:
            raise ConfigError(f"the range for {column!r} is empty: low {low:g} > high {high:g}.")
        return lambda values: (values >= low) & (values <= high)
    if value not in col.levels:
        raise ConfigError(f"{value!r} is not a level of {column!r}: its levels are {list(col.levels)}.")
    return lambda values: values == value


def _by_rejection(draw: Any, checks: dict[str, Any], n: int, seed: int, conditions: dict[str, Any]) -> pd.DataFrame:
    budget = max(MAX_DRAWN_FACTOR * n, MIN_DRAWN)
    kept: list[pd.DataFrame] = []
    found = drawn = attempt = 0
    batch = min(max(2 * n, 1000), MAX_BATCH, budget)
    while found < n and drawn < budget:
        rows = draw(batch, _batch_seed(seed, attempt))
        mask = np.ones(len(rows), dtype=bool)
        for column, check in checks.items():
            mask &= np.asarray(check(rows[column]), dtype=bool)
        kept.append(rows[mask])
        found += int(mask.sum())
        drawn += len(rows)
        attempt += 1
        # The next batch: enough for the rows still missing at the share seen so far, within the budget.
        share = max(found / drawn, 1.0 / drawn)
        batch = int(min(max(1.2 * (n - found) / share, 1000), MAX_BATCH, max(budget - drawn, 1)))
    if found < n:
        raise ConfigError(
            f"The condition {conditions} is too rare to draw {n} rows by rejection: {found} of {drawn} "
            f"drawn rows matched (share {found / drawn:.2g}). Ask for fewer rows or a broader condition."
        )
    return pd.concat(kept, ignore_index=True).iloc[:n].reset_index(drop=True)


def _batch_seed(seed: int, attempt: int) -> int:
    """An independent 63-bit seed per batch of a request."""
    state = np.random.SeedSequence([int(seed), REJECTION_STREAM, attempt]).generate_state(2, np.uint32)
    return ((int(state[0]) >> 1) << 32) | int(state[1])
