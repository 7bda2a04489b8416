"""Stage 8: the internal report (real-data statistics allowed) and the release notes (DP-covered only)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from models.accountant import MECHANISM
from models.config import Profile
from models.encoding import TableEncoder
from models.schema import DatasetSchema
from tasks.report import build_internal_report, build_release_notes
from tasks.stage import read_json, run_stage


def privacy_summary(profile: Profile, settings=None, schema: DatasetSchema | None = None) -> dict:
    """The public description of the privacy setup, keyed as the release notes expect."""
    settings = profile.settings if settings is None else settings
    summary = {
        "mechanism": MECHANISM,
        "accountant": "analytical RDP (autodp), composed T x B times",
        "conversion": "classic: epsilon = min over orders a of RDP(a) + log(1/delta)/(a - 1)",
        "sampling": "one of K discriminators per step, each trained on a disjoint subset (probability 1/K)",
        "adjacency": "replace one row (sensitivity 2C)",
        "unit": "one row of the generator's training table",
        "delta": profile.privacy.delta,
        "noise_multiplier": profile.privacy.noise_multiplier,
        "clip": profile.privacy.clip,
        "batch_size": profile.gan.batch_size,
        "iterations": profile.gan.iterations,
        "checkpoint_every": profile.gan.checkpoint_every,
        "epsilon_budget": profile.privacy.epsilon_budget,
        "settings": {s.name: {"discriminators": s.discriminators, "private": s.private} for s in settings},
    }
    if profile.gan.condition_on_target:
        # A conditional generator's target share is its public prior, not something learned from the rows.
        level = f"{schema.target} = {schema.column(schema.target).levels[1]}" if schema else "the target's second level"
        summary["target_labels"] = (f"set by design, not learned: each synthetic row's target is {level} with "
                                    f"probability {profile.gan.target_prior:g} (a public prior)")
    return summary


def thesis_reference(schema_path: Path, name: str) -> dict | None:
    path = Path(schema_path).parent / "reference" / f"{name}.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else None


def report_stage(run_dir, schema_path: Path, schema: DatasetSchema, paths: dict, chains: list[dict],
                 results_path: Path, chosen: dict, profile: Profile, title: str):
    """Write report.html (internal) and, per chosen setting, release notes."""
    encoder = TableEncoder(schema)

    def work(directory: Path):
        results = pd.read_parquet(results_path)
        encoded = np.load(paths["encoded"])
        real_frame = encoder.decode(encoded[np.load(paths["gan_rows"])])
        ledgers = {c["setting"]: read_json(c["ledger"])["checkpoints"] for c in chains}
        synthetic = {}
        for chain in chains:
            pick = chosen.get(chain["setting"])
            if pick is not None:
                synthetic[chain["setting"]] = pd.read_parquet(
                    Path(chain["samples"]) / f"synthetic_{pick['iteration']:06d}.parquet")
        privacy = privacy_summary(profile, schema=schema)
        imputation = read_json(paths["imputation"])["imputed_values"]
        report = build_internal_report(directory / "report.html", title=title, schema=schema,
                                       results=results, chosen=chosen, real_frame=real_frame,
                                       synthetic_frames=synthetic, ledger_level_shares=ledgers, privacy=privacy,
                                       imputation_counts=imputation,
                                       thesis_reference=thesis_reference(schema_path, schema.name),
                                       max_rows=profile.evaluation.quality_rows, seed=profile.seed)
        outputs = {"report": report}
        for name, frame in synthetic.items():
            setting = next(s for s in profile.settings if s.name == name)
            notes = build_release_notes(directory / f"release_notes_{name}.md", title=f"{title}: {name}",
                                        schema=schema, synthetic_frame=frame,
                                        privacy=privacy_summary(profile, [setting], schema),
                                        chosen={name: chosen[name]}, ledger=ledgers[name])
            outputs[f"notes_{name}"] = notes
        return outputs, {"settings": sorted(synthetic)}

    inputs = {"results": results_path, **{f"ledger_{c['setting']}": Path(c["ledger"]) for c in chains}}
    config = {"chosen": chosen, "profile": dataclasses.asdict(profile), "title": title}
    return run_stage(run_dir, "report", inputs, config, work)
