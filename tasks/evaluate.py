"""Stage 7: Algorithm 3's model selection for every checkpoint, and the real-vs-real baseline.

Each selection run trains 40 logistic-regression candidates on synthetic rows (split like the real
training and validation sets), picks the best by validation AUC, refits on both and scores the real
test split. Under the honest protocol the test split is fixed and never trained on.

Each run also records, on the real validation rows that needed no imputation, what the release's DP
choice scores (models/privacy/release_choice.py): the classifier's concordant pairs (`real_val_pairs`) and the
largest level-count gap to the synthetic shares (`real_val_gap_rows`). Like `real_val_auc` and
`real_val_share_gap` (on every validation row, for the internal report), they are real-data facts that
stay in the run folder and the internal MLflow run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split

from dpsynth.models.config import Profile
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.preprocessing import stratified_split
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.selection import Candidate, regularisation_grid, select_model
from dpsynth.models.generators import get
from dpsynth.models.privacy.release_choice import ValidationFacts
from dpsynth.tasks.encoded_rows import EncodedRows
from dpsynth.tasks.progress import Progress
from dpsynth.tasks.split import SplitFile, evaluation_train
from dpsynth.tasks.stage import StageResult, read_json, run_stage, write_json

RESULT_COLUMNS = [
    "setting",
    "iteration",
    "index",
    "epsilon",
    "penalty",
    "C",
    "val_auc",
    "test_auc",
    "test_auprc",
    "real_val_auc",
    "real_val_share_gap",
    "real_val_pairs",
    "real_val_gap_rows",
    "degenerate",
    "seconds",
]


def complete_rows_path(encoded_path: Path) -> Path:
    """The preprocess stage's mask of rows that needed no imputation, beside its encoded rows."""
    return Path(encoded_path).parent / "complete.npy"


def complete_validation_rows(split: Mapping[str, np.ndarray], complete: np.ndarray) -> np.ndarray:
    return split["val"][complete[split["val"]]]


def validation_facts(schema: DatasetSchema, encoded_path: Path, split_path: Path) -> ValidationFacts:
    """The validation facts of the release's DP decision (see models/privacy/release_choice.py)."""
    encoder = TableEncoder(schema)
    split = SplitFile(split_path)
    rows = complete_validation_rows(split, np.load(complete_rows_path(encoded_path)))
    _, y = features_target(encoder, EncodedRows(encoded_path)[rows])
    positives = int(y.sum())
    return ValidationFacts(rows=len(split["val"]), positives=positives, negatives=len(y) - positives)


def concordant_pairs(scores: np.ndarray, y: np.ndarray) -> float:
    """Pairs (positive, negative) ranked in order, ties counting 1/2: the Mann-Whitney U statistic."""
    positives = int(y.sum())
    if positives == 0 or positives == len(y):
        return 0.0
    ranks = rankdata(scores)
    return float(ranks[y == 1].sum() - positives * (positives + 1) / 2.0)


def level_count_gap(schema: DatasetSchema, frame: pd.DataFrame, synthetic_shares: dict[str, float]) -> float:
    """max over levels of |count in `frame` - synthetic share x rows of `frame`| (in rows)."""
    n = len(frame)
    gaps = [0.0]
    for col in schema.discrete:
        counts = frame[col.name].value_counts()
        gaps += [
            abs(float(counts.get(level, 0)) - synthetic_shares[f"share:{col.name}={level}"] * n) for level in col.levels
        ]
    return max(gaps)


def features_target(encoder: TableEncoder, matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return matrix[:, encoder.feature_indices], (matrix[:, encoder.target_index] > 0).astype(np.int64)


def real_splits(
    split: Mapping[str, np.ndarray],
    encoded: np.ndarray | EncodedRows,
    encoder: TableEncoder,
    protocol: str,
    index: int,
    seed: int,
) -> dict[str, np.ndarray]:
    """Row indices of the real train/val/test sets for evaluation `index`.

    Honest: the test split is the fixed held-out one; the index only reshuffles train/validation
    (used by the real baseline). Thesis: a fresh 0.8/0.1/0.1 split of every row for each index.
    """

    def target_of(rows: np.ndarray) -> np.ndarray:
        return features_target(encoder, encoded[rows])[1]

    if protocol == "thesis":
        rows = split["rows"]
        fractions = (len(split["train"]) / len(rows), len(split["val"]) / len(rows), len(split["test"]) / len(rows))
        parts = stratified_split(target_of(rows), fractions, seed + 7919 * index)
        return {k: rows[v] for k, v in parts.items()}
    train = evaluation_train(split)
    if index == 0:
        return {"train": train, "val": split["val"], "test": split["test"]}
    pool = np.concatenate([train, split["val"]])
    # Stratified where it can be; otherwise not (a level with one row in the pool): a fact of the rows,
    # which changes only the internal baseline's and AUCs' rows, never the split sizes or the DP choice's
    # validation rows (the secret's `split["val"]`).
    y_pool = target_of(pool)
    stratify = y_pool if np.bincount(y_pool, minlength=2).min() >= 2 else None
    train, val = train_test_split(
        pool, test_size=len(split["val"]), random_state=seed + 7919 * index, stratify=stratify
    )
    return {"train": np.sort(train), "val": np.sort(val), "test": split["test"]}


def selection_run(
    X_train: np.ndarray,
    y_train: np.ndarray,
    X_val: np.ndarray,
    y_val: np.ndarray,
    X_test: np.ndarray,
    y_test: np.ndarray,
    X_real_val: np.ndarray,
    y_real_val: np.ndarray,
    candidates: list[Candidate],
    X_choice: np.ndarray | None = None,
    y_choice: np.ndarray | None = None,
) -> dict:
    """One Algorithm 3 run; scores the chosen classifier on the real validation rows (AUC) and, when
    given, counts its concordant pairs on the DP choice's validation rows (X_choice, y_choice)."""
    started = time.perf_counter()
    result = select_model(X_train, y_train, X_val, y_val, X_test, y_test, candidates, method="fast", n_jobs=1)
    real_val_auc = float("nan")
    # NaN too when the real validation rows hold a single class (internal: the run goes on).
    if not result.degenerate and np.unique(y_real_val).size == 2:
        real_val_auc = float(roc_auc_score(y_real_val, result.decision_scores(X_real_val)))
    record = {
        "penalty": result.penalty,
        "C": result.C,
        "val_auc": result.val_auc,
        "test_auc": result.test_auc,
        "test_auprc": result.test_auprc,
        "real_val_auc": real_val_auc,
        "degenerate": bool(result.degenerate),
    }
    if X_choice is not None and y_choice is not None:
        # A degenerate classifier scores every row alike: every pair is a tie.
        record["real_val_pairs"] = concordant_pairs(result.decision_scores(X_choice), y_choice)
    return {**record, "seconds": time.perf_counter() - started}


def synthetic_split(y: np.ndarray, n_train: int, n_val: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic rows split like the real training and validation sets, stratified by the target."""
    stratify = y if np.bincount(y, minlength=2).min() >= 2 else None
    return train_test_split(
        np.arange(len(y)), train_size=n_train, test_size=n_val, random_state=seed, stratify=stratify
    )


def evaluate_synthetic(
    schema: DatasetSchema,
    synthetic_path: Path,
    encoded: np.ndarray | EncodedRows,
    split: Mapping[str, np.ndarray],
    profile: Profile,
    index: int,
    complete: np.ndarray,
) -> dict:
    encoder = TableEncoder(schema)
    real = real_splits(split, encoded, encoder, profile.protocol, index, profile.seed)
    choice_rows = complete_validation_rows(split, complete)
    X_choice, y_choice = features_target(encoder, encoded[choice_rows])
    frame = pd.read_parquet(synthetic_path)
    synthetic = encoder.encode(frame)
    X_syn, y_syn = features_target(encoder, synthetic)
    train, val = synthetic_split(y_syn, len(real["train"]), len(real["val"]), profile.seed + index)
    X_test, y_test = features_target(encoder, encoded[real["test"]])
    X_rv, y_rv = features_target(encoder, encoded[real["val"]])
    candidates = regularisation_grid(
        profile.seed, profile.evaluation.n_regularisation_values, profile.evaluation.penalties
    )
    record = selection_run(
        X_syn[train], y_syn[train], X_syn[val], y_syn[val], X_test, y_test, X_rv, y_rv, candidates, X_choice, y_choice
    )
    shares = level_share_columns(schema, frame)
    real_shares = level_share_columns(schema, encoder.decode(encoded[real["val"]]))
    # Internal, like real_val_auc: derived from the real validation rows (the experiment's choice).
    record["real_val_share_gap"] = max((abs(shares[k] - real_shares[k]) for k in shares), default=0.0)
    # The release's DP choice score reads the complete validation rows only (models/privacy/release_choice.py).
    record["real_val_gap_rows"] = level_count_gap(schema, encoder.decode(encoded[choice_rows]), shares)
    return {**record, **shares}


def level_share_columns(schema: DatasetSchema, frame: pd.DataFrame) -> dict[str, float]:
    """Share of every level of every binary/categorical column, as "share:<column>=<level>" (synthetic
    data only: a collapsed generator shows here as a level with share 0)."""
    out = {}
    for col in schema.discrete:
        counts = frame[col.name].value_counts(normalize=True)
        for level in col.levels:
            out[f"share:{col.name}={level}"] = float(counts.get(level, 0.0))
    return out


def evaluate_real(
    schema: DatasetSchema,
    encoded: np.ndarray | EncodedRows,
    split: Mapping[str, np.ndarray],
    profile: Profile,
    index: int,
) -> dict:
    encoder = TableEncoder(schema)
    real = real_splits(split, encoded, encoder, profile.protocol, index, profile.seed)
    X_tr, y_tr = features_target(encoder, encoded[real["train"]])
    X_va, y_va = features_target(encoder, encoded[real["val"]])
    X_te, y_te = features_target(encoder, encoded[real["test"]])
    candidates = regularisation_grid(
        profile.seed, profile.evaluation.n_regularisation_values, profile.evaluation.penalties
    )
    return selection_run(X_tr, y_tr, X_va, y_va, X_te, y_te, X_va, y_va, candidates)


def synthetic_rows(profile: Profile, split: Mapping[str, np.ndarray]) -> int:
    """Algorithm 3 samples 0.9 n synthetic rows: as many as the real training and validation sets (those
    evaluation reads: bounded on a large table, tasks/split.py)."""
    return len(evaluation_train(split)) + len(split["val"])


def selection_run_stage(
    run_dir: Path,
    schema: DatasetSchema,
    encoded_path: Path,
    split_path: Path,
    profile: Profile,
    setting_name: str,
    index: int,
    iteration: int,
    epsilon: float,
    synthetic_path: Path | None = None,
) -> StageResult:
    """One model-selection run as its own stage: checkpoint `index` of a setting (its synthetic table), or,
    with no synthetic table, index `index` of the real-vs-real baseline."""

    def work(directory: Path) -> tuple[dict[str, Path], dict]:
        encoded = EncodedRows(encoded_path)  # only the rows evaluation reads come into memory
        split = SplitFile(split_path)
        if synthetic_path is None:
            record = evaluate_real(schema, encoded, split, profile, index)
        else:
            record = evaluate_synthetic(
                schema, Path(synthetic_path), encoded, split, profile, index, np.load(complete_rows_path(encoded_path))
            )
        row = {"setting": setting_name, "iteration": iteration, "index": index, "epsilon": epsilon, **record}
        write_json(row, directory / "run.json")
        return {"run": directory / "run.json"}, {"test_auc": record["test_auc"]}

    inputs = {"encoded": encoded_path, "split": split_path, "complete": complete_rows_path(encoded_path)}
    if synthetic_path is not None:
        inputs["synthetic"] = Path(synthetic_path)
    config = {
        "seed": profile.seed,
        "protocol": profile.protocol,
        "evaluation": profile.evaluation.__dict__,
        "iteration": iteration,
        "epsilon": repr(epsilon),
    }
    return run_stage(run_dir, f"evaluate-{setting_name}/{index:03d}", inputs, config, work)


def collect_runs(run_files: list[Path], out: Path) -> Path:
    """The runs' records as one results table (Parquet), in the order given."""
    frame = pd.DataFrame.from_records([read_json(p) for p in run_files])
    ordered = [c for c in RESULT_COLUMNS if c in frame.columns] + [c for c in frame.columns if c not in RESULT_COLUMNS]
    out.parent.mkdir(parents=True, exist_ok=True)
    frame[ordered].to_parquet(out, index=False)
    return out


def checkpoint_runs(ledger_path: Path, sample_dir: Path) -> list[dict]:
    """What each selection run of a setting needs: index, iteration, epsilon and its synthetic table."""
    ledger = read_json(ledger_path)["checkpoints"]
    return [
        {
            "index": i,
            "iteration": e["iteration"],
            "epsilon": e["epsilon"],
            "synthetic_path": Path(sample_dir) / f"synthetic_{e['iteration']:06d}.parquet",
        }
        for i, e in enumerate(ledger)
    ]


def evaluate_setting_stage(
    run_dir: Path,
    schema: DatasetSchema,
    encoded_path: Path,
    split_path: Path,
    ledger_path: Path,
    sample_dir: Path,
    profile: Profile,
    setting_name: str,
) -> dict[str, Path]:
    """Every checkpoint of a setting, one after another (the experiment flow fans these out instead)."""
    runs = selection_runs(
        run_dir, schema, encoded_path, split_path, profile, setting_name, checkpoint_runs(ledger_path, sample_dir)
    )
    return {"results": collect_runs(runs, Path(run_dir) / f"evaluate-{setting_name}" / "selection.parquet")}


def selection_runs(
    run_dir: Path,
    schema: DatasetSchema,
    encoded_path: Path,
    split_path: Path,
    profile: Profile,
    setting_name: str,
    runs: list[dict],
) -> list[Path]:
    """Selection runs one after another, on the progress display; their run.json files."""
    files = []
    with Progress(f"model selection {setting_name}", len(runs), "run") as shown:
        shown.update(0)
        for run in runs:
            stage = selection_run_stage(run_dir, schema, encoded_path, split_path, profile, setting_name, **run)
            files.append(stage["run"])
            shown.update(len(files))
    return files


def real_runs(profile: Profile, runs: int) -> list[dict]:
    """The real baseline's runs, numbered as the profile's generator numbers its checkpoints."""
    every = get(profile.generator).checkpoint_interval(profile)
    return [{"index": i, "iteration": i * every, "epsilon": float("nan")} for i in range(runs)]


def evaluate_real_stage(
    run_dir: Path, schema: DatasetSchema, encoded_path: Path, split_path: Path, profile: Profile, runs: int
) -> dict[str, Path]:
    """The real-vs-real baseline: one selection run per checkpoint index, each with that index's split."""
    files = selection_runs(run_dir, schema, encoded_path, split_path, profile, "real", real_runs(profile, runs))
    return {"results": collect_runs(files, Path(run_dir) / "evaluate-real" / "selection.parquet")}
