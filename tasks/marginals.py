"""The measured marginals of a release (models/marginals/measure.py, models/marginals/release.py), as two stages.

`measure_stage` (once per run, after the split): the marginals of the generator's TRAINING rows, read
as validated decoded values before any imputation (imputation lets one row change another's values;
a missing or invalid value counts in no cell), with noise from the run's secret (purpose "marginals"),
so a resumed run measures the same. Only the noisy measurement leaves the stage.

`attach_stage` (per setting, after training): a copy of every checkpoint file with the measured
marginals in it, and the ledger of those copies, so that the selection samples, the DP choice scores and
the release publishes the same calibrated generator (models/generators/samplers.py `sample_rows`). The
trainer's own files stay as they were, so that an interrupted training resumes from them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth.models.checkpoint_files import load_verified, save_verified
from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.preprocessing import invalid_to_missing
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators import generator_for
from dpsynth.models.generators.base import GeneratorType
from dpsynth.models.generators.samplers import MARGINALS_KEY, sample_rows
from dpsynth.models.marginals.measure import NOISE_PURPOSE, measure
from dpsynth.models.marginals.release import measurement_plan
from dpsynth.models.privacy.secret import load as load_secret
from dpsynth.tasks.stage import StageResult, read_json, run_stage, write_json

MEASURED_FILE = "measured.json"
LEDGER_FILE = "ledger.json"
# Level shares of each calibrated checkpoint's output, on this many rows sampled at seed = its iteration
# (as tasks/training.py records them for uncalibrated checkpoints).
LEVEL_SHARE_ROWS = 2000


def training_values(schema: DatasetSchema, table: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """The training rows' validated values, nothing imputed: invalid values are missing."""
    values, _ = invalid_to_missing(schema, table.iloc[np.sort(rows)])
    return values.reset_index(drop=True)


def measure_stage(
    run_dir: Path, schema: DatasetSchema, table_path: Path, gan_rows_path: Path, profile: Profile
) -> StageResult:
    """Measure the profile's marginals on the generator's training rows (noisy values only)."""

    def work(directory: Path) -> tuple[dict[str, Path], dict]:
        plan = measurement_plan(profile, schema)
        values = training_values(schema, pd.read_parquet(table_path), np.load(gan_rows_path))
        measured = measure(values, schema, plan, load_secret(run_dir), NOISE_PURPOSE)
        write_json(measured.to_dict(), directory / MEASURED_FILE)
        # Public facts only: the plan's, never a count.
        info = {
            "marginals": len(measured.marginals),
            "noise_multiplier": plan.noise_multipliers[0],
            "selections": plan.selections,
            "rho": profile.marginals.rho,
        }
        return {"marginals": directory / MEASURED_FILE}, info

    config = {
        "marginals": dataclasses.asdict(profile.marginals),
        "schema": schema.source_hash,
        "protocol": profile.protocol,
    }
    return run_stage(run_dir, "marginals", {"table": table_path, "gan_rows": gan_rows_path}, config, work)


def attach_stage(
    run_dir: Path,
    schema: DatasetSchema,
    checkpoints_dir: Path,
    ledger_path: Path,
    marginals_path: Path,
    profile: Profile,
    setting: Setting,
) -> StageResult:
    """Copies of the setting's checkpoint files carrying the measured marginals, and their ledger."""
    generator = generator_for(profile, setting)
    encoder = TableEncoder(schema)

    def work(directory: Path) -> tuple[dict[str, Path], dict]:
        recorded = read_json(ledger_path)
        carried = {"measured": read_json(marginals_path), "oversample": profile.marginals.oversample}
        target = directory / "checkpoints"
        target.mkdir(exist_ok=True)
        ledger = [
            _attached(entry, Path(checkpoints_dir), target, carried, generator, encoder)
            for entry in recorded["checkpoints"]
        ]
        write_json({**recorded, "checkpoints": ledger}, directory / LEDGER_FILE)
        return {"checkpoints": target, "ledger": directory / LEDGER_FILE}, {"checkpoints": len(ledger)}

    return run_stage(
        run_dir,
        f"marginals-{setting.name}",
        {"ledger": ledger_path, "marginals": marginals_path},
        {"oversample": profile.marginals.oversample, "generator": generator.name},
        work,
    )


def _attached(
    entry: dict, source: Path, target: Path, carried: dict, generator: GeneratorType, encoder: TableEncoder
) -> dict:
    """One checkpoint's copy with the marginals, and its ledger entry (new hash, calibrated level shares)."""
    blob = load_verified(source / entry["generator"], entry.get("sha256"), map_location="cpu", weights_only=False)
    blob[MARGINALS_KEY] = carried
    digest = save_verified(blob, target / entry["generator"])
    sampler = generator.load(target / entry["generator"], digest)
    rows = sample_rows(sampler, encoder, LEVEL_SHARE_ROWS, entry["iteration"])
    return {**entry, "sha256": digest, "level_shares": encoder.frame_level_shares(rows)}


def released_parameters(generator_file: Path) -> dict:
    """The measurement's public numbers that follow from the schema (how many marginals, their noise
    multiplier, the selection's), read from a released generator file's plan, for release.json and the
    registry tags beside the profile's (`dpsynth.models.marginals.release.public_parameters`); {} without."""
    import torch

    from dpsynth.models.marginals.measure import MeasurementPlan

    blob = torch.load(generator_file, map_location="cpu", weights_only=True)
    if MARGINALS_KEY not in blob:
        return {}
    plan = MeasurementPlan.from_dict(blob[MARGINALS_KEY]["measured"]["plan"])
    return {
        "marginals_count": len(plan.marginals) + plan.selections,
        "marginals_noise_multiplier": plan.noise_multipliers[0],
        "marginals_selection_epsilon": plan.selection_epsilon if plan.selections else None,
    }
