"""Stage 3: invalid values to missing, and the encoding of every row to [-1, 1] by the schema's public
bounds, with the imputation evaluation needs.

Imputation is where one row could reach others, so who imputes whom is part of the privacy argument:

* The generator's training rows are imputed later, per privacy setting, from donors of their own
  critic subset only (tasks/gan.py `training_matrix`), which epsilon covers.
* For evaluation (`encoded.npy`: the real baseline, AUCs on real rows, the internal report), each split
  is imputed from donors of the same split: validation rows from validation rows, test rows from test
  rows, training rows from training rows; never across splits. The DP choice of the release reads
  only the validation rows that needed no imputation (`complete.npy`), so its sensitivity is that of
  one row.
* `protocol: thesis` imputes every row from donors among all rows, as the thesis did (a KNN over all
  rows couples them: the report lists it as not covered, and `release` refuses that protocol).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth.models.config import Profile
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.preprocessing import UnitScaledImputer, invalid_to_missing, typed_frame
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.tasks.cell_counting import read_rows, row_group_layout
from dpsynth.tasks.encoded_rows import write_rows
from dpsynth.tasks.split import SplitFile, evaluation_train
from dpsynth.tasks.stage import StageResult, run_stage, write_json


def gan_rows(split: Mapping[str, np.ndarray], protocol: str) -> np.ndarray:
    """Rows that train the generator: the training split (honest), or every row (thesis protocol)."""
    if protocol == "thesis":
        return np.sort(split["rows"])
    return np.sort(split["train"])


def imputation_scopes(split: Mapping[str, np.ndarray], protocol: str) -> list[np.ndarray]:
    """Groups of rows imputed from each other for evaluation (see the module notes): on a large table,
    the training rows evaluation reads (tasks/split.py `evaluation_train`)."""
    if protocol == "thesis":
        return [np.sort(split["rows"])]
    return [np.sort(evaluation_train(split)), np.sort(split["val"]), np.sort(split["test"])]


def preprocess_stage(
    run_dir: Path, schema: DatasetSchema, table_path: Path, split_path: Path, profile: Profile
) -> StageResult:
    def work(directory: Path) -> tuple[dict[str, Path], dict]:
        split = SplitFile(split_path)
        # The rows evaluation reads: every row of the run, or its bounded parts on a large table, read
        # row group by row group (never the whole table).
        rows = np.sort(np.concatenate(imputation_scopes(split, profile.protocol)))
        n_rows = sum(n for _, n in row_group_layout(table_path))
        numeric, invalid_counts = invalid_to_missing(schema, read_rows(table_path, rows))
        numeric.index = rows
        complete = np.zeros(n_rows, dtype=bool)
        complete[rows] = ~numeric.isna().any(axis=1).to_numpy()
        imputer = UnitScaledImputer(schema, profile.knn_neighbors)
        position = pd.Series(np.arange(len(numeric)), index=numeric.index)
        scopes = [position[part].to_numpy() for part in imputation_scopes(split, profile.protocol)]
        filled = typed_frame(schema, imputer.impute_groups(numeric, scopes))
        encoder = TableEncoder(schema)
        # Encoded (row-local) and written block by block: the rows no evaluation reads stay zeros on disk,
        # and neither the whole encoded matrix nor the file's pages are ever held (tasks/encoded_rows.py).
        write_rows(
            directory / "encoded.npy", n_rows, encoder.width, rows, lambda block: encoder.encode(filled.iloc[block])
        )
        np.save(directory / "complete.npy", complete)
        np.save(directory / "gan_rows.npy", gan_rows(split, profile.protocol))
        # Counts of imputed values are real-data statistics: internal report only.
        scope = (
            "all rows together (thesis protocol)"
            if profile.protocol == "thesis"
            else "training rows within their critic's subset; validation and test rows within their split"
        )
        imputed = {"imputed_values": invalid_counts, "rows": len(rows), "donors": scope}
        write_json(imputed, directory / "imputation.json")
        return (
            {
                "encoded": directory / "encoded.npy",
                "gan_rows": directory / "gan_rows.npy",
                "complete": directory / "complete.npy",
                "imputation": directory / "imputation.json",
            },
            imputed,
        )

    config = {
        "protocol": profile.protocol,
        "k": profile.knn_neighbors,
        "schema": schema.source_hash,
        "scopes": "per split",
    }
    return run_stage(run_dir, "preprocess", {"table": table_path, "split": split_path}, config, work)
