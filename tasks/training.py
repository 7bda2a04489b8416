"""Stages 4 to 6, per privacy setting: partition + imputation + pretraining, private training, sampling.

The partition of the training rows among the K critics and the critic draws and noise of training
come from the run's privacy secret (models/secret.py), read here from the run folder: it never travels
through Prefect, a manifest or a log.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from models.config import Profile, Setting
from models.encoding import TableEncoder
from models.gswgan import (
    LEDGER_FILE,
    GeneratorTrainer,
    kernels_in_use,
    load_generator,
    make_partition,
    planned_iterations,
    pretrain_critics,
    resolve_device,
    sample_encoded,
    subset_sizes,
    target_condition,
)
from models.networks import CriticStack
from models.preprocessing import UnitScaledImputer, invalid_to_missing, typed_frame
from models.schema import DatasetSchema
from models.secret import load as load_secret
from tasks.progress import Progress, note
from tasks.stage import read_json, run_stage, write_json


def encoder_groups(encoder: TableEncoder) -> list[tuple[int, int, str]]:
    return encoder.head_groups()


def generator_condition(encoder: TableEncoder, profile: Profile):
    """The target condition of a conditional generator (None unless `gan.condition_on_target`)."""
    return target_condition(profile.gan, encoder.target_index, encoder.block(encoder.schema.target).column.kind)


def training_matrix(schema: DatasetSchema, table: pd.DataFrame, rows: np.ndarray, partition: np.ndarray,
                    profile: Profile, encoded: np.ndarray) -> np.ndarray:
    """The generator's training rows, encoded, in the order of `rows`.

    Honest protocol: a training row's missing and invalid values are KNN-imputed from donors of its own
    critic subset only (positions partition[k]), so one row changes imputed values inside its own
    subset at most, which the critic holding that subset already depends on: covered by epsilon.
    Thesis protocol: the rows of `encoded`, imputed over all rows (not covered)."""
    if profile.protocol == "thesis":
        return encoded[rows]
    numeric, _ = invalid_to_missing(schema, table.iloc[rows])
    groups = [members[members >= 0] for members in partition]
    imputed = UnitScaledImputer(schema, profile.knn_neighbors).impute_groups(numeric, groups)
    return TableEncoder(schema).encode(typed_frame(schema, imputed)).astype(np.float32)


def _gan_config(profile: Profile, setting: Setting) -> dict:
    return {"seed": profile.seed, "gan": dataclasses.asdict(profile.gan), "setting": dataclasses.asdict(setting),
            "privacy": dataclasses.asdict(profile.privacy)}


def pretrain_stage(run_dir, schema: DatasetSchema, table_path: Path, encoded_path: Path, gan_rows_path: Path,
                   profile: Profile, setting: Setting):
    """Partition the generator's training rows into K disjoint subsets (secret, row-local), impute each
    subset from itself, and pretrain K critics."""
    encoder = TableEncoder(schema)

    def work(directory: Path):
        rows = np.load(gan_rows_path)
        partition = make_partition(len(rows), setting.discriminators, load_secret(run_dir))
        matrix = training_matrix(schema, pd.read_parquet(table_path), rows, partition, profile,
                                 np.load(encoded_path))
        np.save(directory / "partition.npy", partition)
        np.save(directory / "train_rows.npy", matrix)
        data = torch.from_numpy(matrix)
        # Counts iterations of all K critics together (the callback's unit), possibly in jumps.
        with Progress(f"pretraining {setting.name}", profile.gan.pretrain_iterations) as shown:
            shown.update(0)
            critics = pretrain_critics(data, partition, profile.gan, encoder_groups(encoder), profile.seed,
                                       resolve_device(profile.device), progress=shown.update,
                                       condition=generator_condition(encoder, profile))
        torch.save(critics.state_dict(), directory / "critics.pt")
        sizes = subset_sizes(partition)
        info = {"discriminators": setting.discriminators, "subset_rows": [int(sizes.min()), int(sizes.max())],
                "kernels": kernels_in_use(profile.gan, resolve_device(profile.device))}
        return {"partition": directory / "partition.npy", "train_rows": directory / "train_rows.npy",
                "critics": directory / "critics.pt"}, info

    config = {**{k: v for k, v in _gan_config(profile, setting).items() if k != "privacy"},
              "protocol": profile.protocol, "knn_neighbors": profile.knn_neighbors, "partition": "row-local, secret"}
    return run_stage(run_dir, f"pretrain-{setting.name}",
                     {"table": table_path, "encoded": encoded_path, "gan_rows": gan_rows_path}, config, work)


def train_stage(run_dir, schema: DatasetSchema, pretrain_dir: Path, profile: Profile, setting: Setting):
    """Algorithm 2 to the last checkpoint within the budget; resumes from its own last checkpoint."""
    encoder = TableEncoder(schema)

    def work(directory: Path):
        data = torch.from_numpy(np.load(pretrain_dir / "train_rows.npy"))
        partition = np.load(pretrain_dir / "partition.npy")
        device = resolve_device(profile.device)
        state = torch.load(pretrain_dir / "critics.pt", map_location=device, weights_only=False)
        critics = CriticStack.from_params([p.to(device) for p in state["params"]], state["batchnorm"])
        last, _ = planned_iterations(profile.gan, profile.privacy, setting)
        trainer = GeneratorTrainer(data, partition, critics, profile.gan, profile.privacy, setting,
                                   encoder_groups(encoder), profile.seed, directory / "checkpoints", device,
                                   load_secret(run_dir), level_share_fn=encoder.level_shares,
                                   condition=generator_condition(encoder, profile))
        epsilon = [""]  # the training epsilon reached, known at each checkpoint

        def checkpoint(_: int, eps: float) -> None:
            epsilon[0] = f"epsilon {eps:.3f}"

        with Progress(f"training {setting.name}", last) as shown:
            result = trainer.run(last, progress=checkpoint, on_step=lambda it: shown.update(it, epsilon[0]))
        for line in trainer.resume_notes:
            note(f"training {setting.name}: {line}")
        info = {"last_iteration": last, "stopped_by_budget": result.stopped_by_budget,
                "resume_notes": trainer.resume_notes,
                "final_epsilon": result.checkpoints[-1]["epsilon"], "seconds": round(result.seconds, 2),
                "critic_updates": "native" if trainer.native_critics else "torch"}
        # Critic estimates come from real rows: an internal file, never part of the ledger or the bundle.
        write_json({"critic_wasserstein": result.metrics}, directory / "internal_metrics.json")
        return {"checkpoints": directory / "checkpoints", "ledger": directory / "checkpoints" / LEDGER_FILE,
                "internal_metrics": directory / "internal_metrics.json"}, info

    return run_stage(run_dir, f"train-{setting.name}",
                     {"train_rows": pretrain_dir / "train_rows.npy", "partition": pretrain_dir / "partition.npy",
                      "critics": pretrain_dir / "critics.pt"},
                     _gan_config(profile, setting), work)


def sample_stage(run_dir, schema: DatasetSchema, checkpoints_dir: Path, n_rows: int, profile: Profile,
                 setting: Setting):
    """Sample n rows at every checkpoint, decoded to the schema (synthetic: covered by the DP guarantee)."""
    encoder = TableEncoder(schema)

    def work(directory: Path):
        ledger = read_json(checkpoints_dir / LEDGER_FILE)["checkpoints"]
        files = {}
        with Progress(f"sampling {setting.name}", len(ledger), "checkpoint") as shown:
            shown.update(0)
            for entry in ledger:
                gen, _ = load_generator(checkpoints_dir / entry["generator"], sha256=entry.get("sha256"))
                rows = sample_encoded(gen, n_rows, seed=profile.seed * 1_000_003 + entry["iteration"])
                path = directory / f"synthetic_{entry['iteration']:06d}.parquet"
                encoder.decode(rows).to_parquet(path, index=False)
                files[f"iter_{entry['iteration']:06d}"] = path
                shown.update(len(files))
        return files, {"checkpoints": len(files), "rows": n_rows}

    return run_stage(run_dir, f"sample-{setting.name}", {"checkpoints": checkpoints_dir},
                     {"seed": profile.seed, "rows": n_rows}, work)


def sample_generator_file(path: Path, schema: DatasetSchema, n_rows: int, seed: int, sha256: str | None = None):
    gen, _ = load_generator(path, sha256=sha256)
    return TableEncoder(schema).decode(sample_encoded(gen, n_rows, seed))
