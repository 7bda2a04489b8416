"""Which training rows each site holds. Sites are disjoint: every row belongs to exactly one.

* `iid: N`: each row's site is drawn uniformly from the run's secret, by position: a row's site does not
  depend on any row's values, so replacing a row changes one site's rows only.
* `column: NAME` (the schema's site column) and `by_column: NAME` (a public rule: one site per level, or
  per equal-width bin of a continuous column's declared bounds): a row's site is a function of its own
  value. Replacing a row may move it from one site to another: one site loses a row, another gains one
  (docs/privacy.md: the worst site's replace-one epsilon still covers it).
"""

from __future__ import annotations

import numpy as np

from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import Column, DatasetSchema
from dpsynth.models.errors import ConfigError
from dpsynth.models.generators.dpfedctgan.config import DPFedCTGANConfig
from dpsynth.models.privacy.secret import PrivacySecret


def site_count(config: DPFedCTGANConfig, schema: DatasetSchema | None) -> int:
    """How many sites (clients) the split makes: public (the profile and the schema)."""
    split = config.sites
    if split.iid is not None:
        return int(split.iid)
    name = split.column if split.column is not None else split.by_column
    if schema is None:
        raise ConfigError("a split by column needs the schema to count its sites")
    column = _column(schema, str(name), site_column=split.column is not None)
    if column.kind == "continuous":
        return int(config.by_column_bins)
    return 2 if column.kind == "binary" else len(column.levels)


def check_split(config: DPFedCTGANConfig, schema: DatasetSchema) -> None:
    site_count(config, schema)


def _column(schema: DatasetSchema, name: str, site_column: bool) -> Column:
    names = [c.name for c in schema.columns]
    if name not in names:
        raise ConfigError(f"dpfedctgan.sites names the column {name!r}, which the schema does not have")
    column = schema.column(name)
    if site_column and column.kind == "continuous":
        raise ConfigError(f"dpfedctgan.sites.column: a site column is binary or categorical; {name!r} is continuous")
    return column


def split_rows(
    data: np.ndarray, schema: DatasetSchema, config: DPFedCTGANConfig, secret: PrivacySecret
) -> list[np.ndarray]:
    """Positions of each site's rows in `data` (encoded rows), in site order."""
    n_sites = site_count(config, schema)
    sites: np.ndarray  # each row's site
    if config.sites.iid is not None:
        sites = np.asarray(secret.numpy("dpfedctgan-iid-sites").integers(0, n_sites, size=data.shape[0]))
    else:
        name = str(config.sites.column if config.sites.column is not None else config.sites.by_column)
        block = TableEncoder(schema).block(name)
        values = data[:, block.start : block.stop]
        if block.column.kind == "binary":
            sites = (values[:, 0] > 0).astype(np.int64)
        elif block.column.kind == "categorical":
            sites = values.argmax(axis=1)
        else:  # equal-width bins of the declared bounds: [-1, 1] once encoded
            sites = np.clip(np.floor((values[:, 0] + 1.0) / 2.0 * n_sites), 0, n_sites - 1).astype(np.int64)
    return [np.flatnonzero(sites == k) for k in range(n_sites)]


def describe_split(config: DPFedCTGANConfig) -> str:
    """The split rule in words (the privacy statement)."""
    split = config.sites
    if split.iid is not None:
        return f"{split.iid} sites; each row's site drawn uniformly from a secret drawn for the run (IID)"
    if split.column is not None:
        return f"one site per level of the site column {split.column!r}"
    return f"one site per level (or bin of its declared bounds) of the column {split.by_column!r} (non-IID)"
