"""Stage 8: the internal report (real-data statistics allowed) and the release notes (DP-covered only)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import yaml

from dpsynth.models.config import Profile
from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.evaluation.membership import membership_report
from dpsynth.tasks.decision import statement_for
from dpsynth.tasks.encoded_rows import EncodedRows
from dpsynth.tasks.privacy_summary import privacy_summary
from dpsynth.tasks.report import build_internal_report, build_release_notes, write_public_release_notes
from dpsynth.tasks.report.internal import fidelity_figures
from dpsynth.tasks.split import SplitFile, evaluation_train
from dpsynth.tasks.stage import StageResult, read_json, run_stage, write_json
from dpsynth.tasks.training import sample_generator_file
from dpsynth.tasks.validate import repairs_of

if TYPE_CHECKING:
    from dpsynth.tasks.public_release import PublicRelease


def compare_generators(
    schema: DatasetSchema, profile: Profile, chosen: dict, real_frame: pd.DataFrame, synthetic: dict[str, pd.DataFrame]
) -> dict:
    """Where the settings use more than one generator: per chosen setting, its generator, epsilon, test
    AUC and sample quality against the real training rows (internal: real-data statistics)."""
    from dpsynth.models.evaluation.quality import quality_summary

    settings = {s.name: s for s in profile.settings}
    if len({profile.generator_of(s) for s in settings.values()}) < 2:
        return {}
    table = {}
    for name, frame in synthetic.items():
        quality = quality_summary(schema, real_frame, frame, profile.evaluation.quality_rows, profile.seed)
        table[name] = {
            "generator": profile.generator_of(settings[name]),
            "epsilon_budget": profile.budget_for(settings[name]),
            "epsilon": chosen[name]["epsilon"],
            "iteration": chosen[name]["iteration"],
            "test_auc": chosen[name]["test_auc"],
            "spearman_mad": quality["spearman_mad"],
            "mean_tvd": quality["mean_tvd"],
            "mean_wasserstein": quality["mean_wasserstein"],
        }
    return table


def membership_of(
    encoder: TableEncoder,
    encoded: np.ndarray | EncodedRows,
    gan_rows: np.ndarray,
    split: Mapping[str, np.ndarray],
    synthetic: dict,
    seed: int,
) -> dict:
    """Membership inference against each chosen checkpoint's synthetic table (models/evaluation/membership.py):
    members are the generator's training rows, non-members the test rows, the reference the validation
    rows (under the thesis protocol the generator saw every row: no non-member is left to compare)."""
    members = set(gan_rows.tolist())
    outside = np.array([r for r in split["test"] if r not in members], dtype=np.int64)
    if len(outside) < 10:
        return {}
    reference = np.array([r for r in split["val"] if r not in members], dtype=np.int64)
    reference = reference if len(reference) >= 10 else outside
    return {
        name: membership_report(
            encoder.encode(frame), encoded[gan_rows], encoded[outside], encoded[reference], seed=seed
        )
        for name, frame in synthetic.items()
    }


def thesis_reference(schema_path: Path, name: str) -> dict | None:
    path = Path(schema_path).parent / "reference" / f"{name}.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else None


def report_stage(
    run_dir: Path,
    schema_path: Path,
    schema: DatasetSchema,
    paths: dict,
    chains: list[dict],
    results_path: Path,
    chosen: dict,
    profile: Profile,
    title: str,
    release: bool = False,
    public_release: PublicRelease | None = None,
) -> StageResult:
    """Write report.html (internal) and, per chosen setting, release notes. `release`: the run is a
    release (its checkpoint was chosen by the DP decision), not the experiment's internal study; its
    notes are rendered from `public_release`, the release's public record (required with `release`)."""
    encoder = TableEncoder(schema)

    def work(directory: Path) -> tuple[dict[str, Path], dict]:
        results = pd.read_parquet(results_path)
        encoded = EncodedRows(paths["encoded"])  # only the rows evaluation reads come into memory
        split = SplitFile(paths["split"])
        # The generator's training rows as evaluation reads them (all, or their bounded subsample).
        train_rows = np.load(paths["gan_rows"]) if profile.protocol == "thesis" else evaluation_train(split)
        real_frame = encoder.decode(encoded[train_rows])
        ledgers = {c["setting"]: read_json(c["ledger"])["checkpoints"] for c in chains}
        synthetic = {}
        for chain in chains:
            pick = chosen.get(chain["setting"])
            if pick is not None:
                synthetic[chain["setting"]] = pd.read_parquet(
                    Path(chain["samples"]) / f"synthetic_{pick['iteration']:06d}.parquet"
                )
        privacy = privacy_summary(profile, schema=schema)
        imputation = read_json(paths["imputation"])["imputed_values"]
        membership = membership_of(encoder, encoded, train_rows, split, synthetic, profile.seed)
        write_json(membership, directory / "membership.json")
        comparison = compare_generators(schema, profile, chosen, real_frame, synthetic)
        if comparison:
            write_json(comparison, directory / "comparison.json")
        figures = fidelity_figures(schema, real_frame, synthetic, profile.evaluation.quality_rows, profile.seed)
        # The figures the report shows, for the run's summary and `dpsynth.Release.fidelity` (internal).
        write_json(figures, directory / "fidelity.json")
        summary_path = paths.get("validation_summary")
        repairs = repairs_of(read_json(summary_path)) if summary_path else None
        private = [s for s in profile.settings if s.private]
        shown = profile.release_target() if release else (private or list(profile.settings))[0]
        report = build_internal_report(
            directory / "report.html",
            title=title,
            schema=schema,
            results=results,
            chosen=chosen,
            real_frame=real_frame,
            synthetic_frames=synthetic,
            ledger_level_shares=ledgers,
            privacy=privacy,
            statement=statement_for(profile, shown, release=release),
            imputation_counts=imputation,
            thesis_reference=thesis_reference(schema_path, schema.name),
            membership=membership,
            comparison=comparison,
            max_rows=profile.evaluation.quality_rows,
            seed=profile.seed,
            figures=figures,
            input_repairs=repairs,
        )
        outputs = {
            "report": report,
            "membership": directory / "membership.json",
            "fidelity": directory / "fidelity.json",
        }
        if comparison:
            outputs["comparison"] = directory / "comparison.json"
        for name, frame in synthetic.items():
            setting = next(s for s in profile.settings if s.name == name)
            if release:
                # The published notes describe the published table: `release_rows` rows (a public number)
                # from the chosen generator, as the bundle samples them, never the checkpoint's sample,
                # which has as many rows as the training split.
                chain = next(c for c in chains if c["setting"] == name)
                entry = next(e for e in ledgers[name] if e["iteration"] == chosen[name]["iteration"])
                frame = sample_generator_file(
                    Path(chain["checkpoints"]) / entry["generator"],
                    schema,
                    profile.release_rows,
                    seed=profile.seed,
                    sha256=entry.get("sha256"),
                    generator=chain["generator"],
                )
                if public_release is None:
                    raise ValueError("a release's notes are rendered from its public record: pass public_release.")
                notes = write_public_release_notes(
                    directory / f"release_notes_{name}.md",
                    public_release,
                    title=f"{title}: {name}",
                    schema=schema,
                    synthetic_frame=frame,
                )
            else:
                notes = build_release_notes(
                    directory / f"release_notes_{name}.md",
                    title=f"{title}: {name}",
                    schema=schema,
                    synthetic_frame=frame,
                    privacy=privacy_summary(profile, [setting], schema),
                    chosen={name: chosen[name]},
                    ledger=ledgers[name],
                    statement=statement_for(profile, setting, release=release),
                )
            outputs[f"notes_{name}"] = notes
        return outputs, {"settings": sorted(synthetic)}

    inputs = {"results": results_path, **{f"ledger_{c['setting']}": Path(c["ledger"]) for c in chains}}
    config = {"chosen": chosen, "profile": profile.to_dict(), "title": title, "release": release}
    return run_stage(run_dir, "report", inputs, config, work)
