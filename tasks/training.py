"""Stages 4 to 6, per setting, for any generator (models/generators/): prepare the training rows (and
whatever the generator does before training, e.g. GS-WGAN's pretraining), train to the planned last
checkpoint, sample every checkpoint.

The privacy randomness (the partition, batches, critic draws, noise) comes from the run's privacy
secret (models/privacy/secret.py), read here from the run folder: it never travels through Prefect, a
manifest or a log.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.cell_counts import CellCounts
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.preprocessing import UnitScaledImputer, invalid_to_missing, typed_frame
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators import generator_for, registration
from dpsynth.models.generators.base import GeneratorType, TrainingJob
from dpsynth.models.generators.samplers import sample_rows
from dpsynth.models.privacy.secret import load as load_secret
from dpsynth.tasks.cell_counting import count_training_cells, write_public_training_matrix
from dpsynth.tasks.cluster import cluster_map
from dpsynth.tasks.progress import Progress, note
from dpsynth.tasks.stage import StageResult, read_json, run_stage, write_json

LEDGER_FILE = "ledger.json"
# The prepare stage's exact cell counts of the training rows, for a generator that reads nothing else.
COUNTS_FILE = "cell_counts.npz"
# Level shares of each checkpoint's output, on this many rows sampled at seed = its iteration.
LEVEL_SHARE_ROWS = 2000


def training_matrix(
    schema: DatasetSchema,
    table: pd.DataFrame,
    rows: np.ndarray,
    groups: list[np.ndarray] | None,
    profile: Profile,
    encoded: np.ndarray,
) -> np.ndarray:
    """The generator's training rows, encoded, in the order of `rows`.

    Honest protocol: a training row's missing and invalid values are KNN-imputed from donors of its own
    group only (`groups`, positions into `rows`: the generator says which rows may reach each other, e.g.
    GS-WGAN's critic subsets); with no groups, each gap takes the middle of its public range, so no row
    reaches another. Either way covered by epsilon. Thesis protocol: the rows of `encoded`, imputed over
    all rows (not covered)."""
    if profile.protocol == "thesis":
        return encoded[rows]
    numeric, _ = invalid_to_missing(schema, table.iloc[rows])
    imputer = UnitScaledImputer(schema, profile.knn_neighbors)
    imputed = imputer.impute_groups(numeric, groups) if groups is not None else imputer.fill_public(numeric)
    return TableEncoder(schema).encode(typed_frame(schema, imputed)).astype(np.float32)


def prepared_rows_path(prepare_dir: Path) -> Path:
    """The prepare stage's training rows: their cell counts (a generator that reads nothing else), or the
    encoded matrix."""
    counts_path = Path(prepare_dir) / COUNTS_FILE
    return counts_path if counts_path.exists() else Path(prepare_dir) / "train_rows.npy"


def prepared_rows(
    prepare_dir: Path, schema: DatasetSchema, mapped: bool = False
) -> tuple[np.ndarray, CellCounts | None]:
    """A `TrainingJob`'s `data` and `counts` from the prepare stage's folder; `mapped`: the rows as a
    read-only memory map (the generator's `mapped_rows`), else in memory."""
    path = prepared_rows_path(prepare_dir)
    if path.name == COUNTS_FILE:
        return _no_rows(schema), CellCounts.load(path)
    return np.load(path, mmap_mode="r" if mapped else None), None


def _no_rows(schema: DatasetSchema) -> np.ndarray:
    """The job's encoded rows when its cell counts stand for them: none."""
    return np.zeros((0, TableEncoder(schema).width), dtype=np.float32)


def _config(profile: Profile, setting: Setting) -> dict:
    """What a setting's training depends on: the shared keys and its generator's section, and the
    measured marginals where the profile measures them (their cost is in every checkpoint's epsilon)."""
    name = profile.generator_of(setting)
    measured = {"marginals": dataclasses.asdict(profile.marginals)} if profile.marginals.enabled else {}
    return {
        "seed": profile.seed,
        "generator": name,
        registration(name).section: profile.section(name).model_dump(),
        "setting": dataclasses.asdict(setting),
        "privacy": dataclasses.asdict(profile.privacy),
        **measured,
    }


def stage_name(profile: Profile, setting: Setting, step: str) -> str:
    """A setting's stage folder; GS-WGAN's keep their names from before there were other generators."""
    if step == "prepare":
        step = generator_for(profile, setting).prepare_name
    return f"{step}-{setting.name}"


def prepare_stage(
    run_dir: Path,
    schema: DatasetSchema,
    table_path: Path,
    encoded_path: Path,
    gan_rows_path: Path,
    profile: Profile,
    setting: Setting,
    cluster: str | None = None,
) -> StageResult:
    """Impute the training rows within the groups the generator allows, then its own preparation; for a
    generator that reads only cell counts, count them instead. With `cluster` (a Dask scheduler's address)
    the counting, or GS-WGAN's pretraining chunks, run on its workers: the same counts and the same
    critics, so not part of the stage's configuration."""
    generator = generator_for(profile, setting)

    counted = generator.counted_cells(profile, setting, schema) if profile.protocol != "thesis" else None

    def work(directory: Path) -> tuple[dict[str, Path], dict]:
        rows = np.load(gan_rows_path)
        secret = load_secret(run_dir)
        groups = generator.donor_groups(len(rows), profile, setting, secret)
        if counted is not None and groups is None:
            # A generator that reads only cell counts of rows that impute nothing from each other: one
            # pass over the table's row groups, no matrix (tasks/cell_counting.py).
            cliques, fine, bins = counted
            counts = count_training_cells(
                schema, table_path, rows, profile.knn_neighbors, bins, cliques, fine, generator.label, cluster
            )
            counts.save(directory / COUNTS_FILE)
            job = TrainingJob(profile, setting, schema, _no_rows(schema), secret, directory, counts=counts)
            files, info = generator.prepare(job)
            return {"cell_counts": directory / COUNTS_FILE, **files}, {"generator": generator.name, **info}
        if groups is None and profile.protocol != "thesis":
            # No row imputes another: the matrix is written one row group at a time, no table in memory.
            write_public_training_matrix(schema, table_path, rows, profile.knn_neighbors, directory / "train_rows.npy")
            matrix = np.load(directory / "train_rows.npy", mmap_mode="r" if generator.mapped_rows else None)
        else:
            encoded = np.load(encoded_path, mmap_mode="r")  # read by the thesis protocol only
            matrix = training_matrix(schema, pd.read_parquet(table_path), rows, groups, profile, encoded)
            np.save(directory / "train_rows.npy", matrix)
        job = TrainingJob(profile, setting, schema, matrix, secret, directory, task_map=cluster_map(cluster))
        units = generator.prepare_units(profile)
        if units:
            with Progress(f"{generator.prepare_name}ing {setting.name}", units) as shown:
                shown.update(0)
                files, info = generator.prepare(job, progress=lambda done, _: shown.update(done))
        else:
            files, info = generator.prepare(job)
        return {"train_rows": directory / "train_rows.npy", **files}, {"generator": generator.name, **info}

    config = {
        **{k: v for k, v in _config(profile, setting).items() if k not in ("privacy", "marginals")},
        "protocol": profile.protocol,
        "knn_neighbors": profile.knn_neighbors,
        "imputation": "row-local, secret groups",
    }
    return run_stage(
        run_dir,
        stage_name(profile, setting, "prepare"),
        {"table": table_path, "encoded": encoded_path, "gan_rows": gan_rows_path},
        config,
        work,
    )


def _with_level_shares(
    ledger: list[dict], generator: GeneratorType, checkpoints: Path, encoder: TableEncoder
) -> list[dict]:
    """Each checkpoint's level shares (synthetic rows only: free), where the generator did not record them."""
    out = []
    for entry in ledger:
        if "level_shares" not in entry:
            sampler = generator.load(checkpoints / entry["generator"], entry.get("sha256"))
            entry = {
                **entry,
                "level_shares": encoder.level_shares(sampler.sample(LEVEL_SHARE_ROWS, entry["iteration"])),
            }
        out.append(entry)
    return out


def train_stage(
    run_dir: Path, schema: DatasetSchema, prepare_dir: Path, profile: Profile, setting: Setting
) -> StageResult:
    """Train to the last checkpoint the plan allows (within the budget); resumes from its own last one."""
    generator = generator_for(profile, setting)

    rows_path = prepared_rows_path(prepare_dir)

    def work(directory: Path) -> tuple[dict[str, Path], dict]:
        plan = generator.plan(profile, setting)
        data, counts = prepared_rows(prepare_dir, schema, generator.mapped_rows)
        job = TrainingJob(profile, setting, schema, data, load_secret(run_dir), directory, counts=counts)
        with Progress(f"training {setting.name}", plan.last) as shown:
            result = generator.fit(job, Path(prepare_dir), plan, progress=shown.update)
        for line in result.resume_notes:
            note(f"training {setting.name}: {line}")
        ledger = _with_level_shares(result.ledger, generator, directory / "checkpoints", TableEncoder(schema))
        facts = generator.privacy_facts(profile, setting)
        write_json(
            {
                "generator": generator.name,
                "mechanism": facts.mechanism if setting.private else None,
                "adjacency": facts.adjacency,
                "checkpoints": ledger,
            },
            directory / LEDGER_FILE,
        )
        info = {
            "generator": generator.name,
            "last_iteration": plan.last,
            "stopped_by_budget": plan.stopped_by_budget,
            "resume_notes": result.resume_notes,
            "final_epsilon": ledger[-1]["epsilon"],
            "seconds": round(result.seconds, 2),
            **result.info,
        }
        # Estimates computed on real rows (critics, losses): an internal file, never the ledger or the bundle.
        write_json(result.internal_metrics, directory / "internal_metrics.json")
        return {
            "checkpoints": directory / "checkpoints",
            "ledger": directory / LEDGER_FILE,
            "internal_metrics": directory / "internal_metrics.json",
        }, info

    return run_stage(
        run_dir,
        stage_name(profile, setting, "train"),
        {"train_rows": rows_path},
        _config(profile, setting),
        work,
    )


def sample_stage(
    run_dir: Path,
    schema: DatasetSchema,
    checkpoints_dir: Path,
    ledger_path: Path,
    n_rows: int,
    profile: Profile,
    setting: Setting,
) -> StageResult:
    """Sample n rows at every checkpoint, decoded to the schema (synthetic: covered by the DP guarantee)."""
    encoder = TableEncoder(schema)
    generator = generator_for(profile, setting)

    def work(directory: Path) -> tuple[dict[str, Path], dict]:
        ledger = read_json(ledger_path)["checkpoints"]
        files: dict[str, Path] = {}
        with Progress(f"sampling {setting.name}", len(ledger), "checkpoint") as shown:
            shown.update(0)
            for entry in ledger:
                sampler = generator.load(Path(checkpoints_dir) / entry["generator"], entry.get("sha256"))
                rows = sample_rows(sampler, encoder, n_rows, profile.seed * 1_000_003 + entry["iteration"])
                path = directory / f"synthetic_{entry['iteration']:06d}.parquet"
                rows.to_parquet(path, index=False)
                files[f"iter_{entry['iteration']:06d}"] = path
                shown.update(len(files))
        return files, {"checkpoints": len(files), "rows": n_rows}

    return run_stage(
        run_dir,
        stage_name(profile, setting, "sample"),
        {"ledger": ledger_path},
        {"seed": profile.seed, "rows": n_rows},
        work,
    )


def sample_generator_file(
    path: Path, schema: DatasetSchema, n_rows: int, seed: int, sha256: str | None = None, generator: str | None = None
) -> pd.DataFrame:
    """n rows, decoded, from a released file (it names its generator) or a checkpoint of `generator`."""
    from dpsynth.models.generators.samplers import load_sampler

    return sample_rows(load_sampler(path, sha256, generator), TableEncoder(schema), n_rows, seed)
