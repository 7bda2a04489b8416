"""Stage 3: invalid values to missing, KNN imputation fitted on the generator's training rows only,
and the encoding of every row to [-1, 1] by the schema's public bounds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from models.config import Profile
from models.encoding import TableEncoder
from models.preprocessing import UnitScaledImputer, invalid_to_missing, typed_frame
from models.schema import DatasetSchema
from tasks.stage import run_stage, write_json


def gan_rows(split: dict, protocol: str) -> np.ndarray:
    """Rows that train the generator: the training split (honest), or every row (thesis protocol)."""
    if protocol == "thesis":
        return np.sort(split["rows"])
    return np.sort(split["train"])


def preprocess_stage(run_dir, schema: DatasetSchema, table_path: Path, split_path: Path, profile: Profile):
    def work(directory: Path):
        table = pd.read_parquet(table_path)
        split = dict(np.load(split_path))
        numeric, invalid_counts = invalid_to_missing(schema, table.iloc[split["rows"]])
        numeric.index = split["rows"]
        fit_rows = gan_rows(split, profile.protocol)
        imputer = UnitScaledImputer(schema, profile.knn_neighbors).fit(numeric.loc[fit_rows])
        complete = typed_frame(schema, imputer.transform(numeric))
        encoded = np.zeros((len(table), TableEncoder(schema).width), dtype=np.float32)
        encoded[split["rows"]] = TableEncoder(schema).encode(complete)
        np.save(directory / "encoded.npy", encoded)
        np.save(directory / "gan_rows.npy", fit_rows)
        # Counts of imputed values are real-data statistics: internal report only.
        imputed = {"imputed_values": invalid_counts, "rows": len(split["rows"]),
                   "imputer_fitted_on": "all rows" if profile.protocol == "thesis" else "training rows"}
        write_json(imputed, directory / "imputation.json")
        return ({"encoded": directory / "encoded.npy", "gan_rows": directory / "gan_rows.npy",
                 "imputation": directory / "imputation.json"}, imputed)

    config = {"protocol": profile.protocol, "k": profile.knn_neighbors, "schema": schema.source_hash}
    return run_stage(run_dir, "preprocess", {"table": table_path, "split": split_path}, config, work)
