"""Stage chains shared by the release and experiment flows (wiring only)."""

from __future__ import annotations

from pathlib import Path

from dpsynth.flows import stages
from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.schema import DatasetSchema


def prepare(run_dir: Path, schema_path: Path, schema: DatasetSchema, data_path: Path, profile: Profile) -> dict:
    """validate -> split -> preprocess (-> measure the marginals of the training rows, when the profile
    asks); returns the paths later stages read (`marginals`: the measurement, or None)."""
    validated = stages.validate_table(
        run_dir, schema_path, data_path, max_repaired_share=profile.input.max_repaired_share
    )
    split = stages.split_table(run_dir, schema, validated["table"], profile)
    prep = stages.preprocess_table(run_dir, schema, validated["table"], split["split"], profile)
    measured = (
        stages.measure_marginals(run_dir, schema, validated["table"], prep["gan_rows"], profile)
        if profile.marginals.enabled
        else None
    )
    return {
        "table": validated["table"],
        "validation_summary": validated["summary"],
        "split": split["split"],
        "encoded": prep["encoded"],
        "gan_rows": prep["gan_rows"],
        "imputation": prep["imputation"],
        "validation_info": validated.info,
        "marginals": measured["marginals"] if measured else None,
    }


def train_chain(
    run_dir: Path, schema: DatasetSchema, paths: dict, profile: Profile, setting: Setting, cluster: str | None = None
) -> dict:
    """prepare (impute; GS-WGAN: pretrain) -> train (-> the checkpoints with the measured marginals) ->
    sample every checkpoint, for one setting. The chain's checkpoints are those a release publishes."""
    pre = stages.prepare_training(
        run_dir, schema, paths["table"], paths["encoded"], paths["gan_rows"], profile, setting, cluster=cluster
    )
    trained = stages.train_generator(run_dir, schema, pre.directory, profile, setting)
    released = trained
    if paths.get("marginals") is not None:
        released = stages.attach_marginals(
            run_dir, schema, trained["checkpoints"], trained["ledger"], paths["marginals"], profile, setting
        )
    from dpsynth.tasks.evaluate import synthetic_rows  # scikit-learn: loaded once training is done
    from dpsynth.tasks.split import SplitFile

    n_rows = synthetic_rows(profile, SplitFile(paths["split"]))
    samples = stages.sample_checkpoints(
        run_dir, schema, released["checkpoints"], released["ledger"], n_rows, profile, setting
    )
    return {
        "setting": setting.name,
        "generator": profile.generator_of(setting),
        "checkpoints": released["checkpoints"],
        "ledger": released["ledger"],
        "samples": samples.directory,
        "train_info": trained.info,
        "internal_metrics": trained["internal_metrics"],
    }


def setting_chain(
    run_dir: Path, schema: DatasetSchema, paths: dict, profile: Profile, setting: Setting, cluster: str | None = None
) -> dict:
    """train_chain (its counting on the Dask cluster at `cluster`, if any), then model selection at every
    checkpoint, one after another."""
    chain = train_chain(run_dir, schema, paths, profile, setting, cluster)
    selected = stages.select_models(
        run_dir, schema, paths["encoded"], paths["split"], chain["ledger"], chain["samples"], profile, setting.name
    )
    return {**chain, "results": selected["results"]}


def wait_showing_progress(futures: list, stage: str, unit: str = "run") -> None:
    """Wait for task futures, counting them on the progress display as they complete. Futures that
    completed earlier count at once, so the first rate and time left are optimistic."""
    from prefect.futures import as_completed

    from dpsynth.tasks.progress import Progress

    with Progress(stage, len(futures), unit) as shown:
        shown.update(0)
        for done, _ in enumerate(as_completed(futures), 1):
            shown.update(done)


def log_training(run_id: str, chain: dict) -> None:
    """Epsilon per checkpoint and the critic's estimates (internal) to the MLflow run."""
    from dpsynth.tasks import tracking
    from dpsynth.tasks.stage import read_json

    name = chain["setting"]
    ledger = read_json(chain["ledger"])["checkpoints"]
    tracking.log_metric_series(run_id, f"{name}.epsilon", [(e["iteration"], e["epsilon"]) for e in ledger])
    curve = read_json(chain["internal_metrics"]).get("critic_wasserstein", [])
    if curve:
        tracking.log_metric_series(
            run_id, f"{name}.internal.critic_wasserstein", [(m["iteration"], m["critic_wasserstein"]) for m in curve]
        )


def publish_report(
    run_id: str,
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
    public_release=None,
):
    """The report stage (a release's notes rendered from its `public_release` record), then its files to
    MLflow and a summary and table as Prefect artifacts."""
    import pandas as pd
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    from dpsynth.tasks import tracking
    from dpsynth.tasks.prefect_summary import public_selection_records, public_summary_markdown

    report = stages.write_report(
        run_dir, schema_path, schema, paths, chains, results_path, chosen, profile, title, release, public_release
    )
    from dpsynth.tasks.progress import status

    status("logging the report")
    tracking.log_artifact(run_id, report["report"], "report")
    for key, path in report.outputs.items():
        if key.startswith("notes_"):
            tracking.log_artifact(run_id, path, "release_notes")
    results = pd.read_parquet(results_path)
    tracking.log_table(run_id, results, "selection_runs.json")
    # Prefect's database is not the owner-only home: its artifacts show public facts only.
    create_markdown_artifact(
        public_summary_markdown(results, chosen, str(report["report"]), dp_choice=release),
        key=_artifact_key(title, "summary"),
        description="dpsynth run summary (public facts; real-data figures in the internal report)",
    )
    create_table_artifact(
        public_selection_records(results),
        key=_artifact_key(title, "selection"),
        description="every checkpoint and its training epsilon",
    )
    return report


def _artifact_key(title: str, kind: str) -> str:
    # Prefect artifact keys: lowercase letters, digits and dashes.
    slug = "".join(ch if ch.isalnum() else "-" for ch in title.lower()).strip("-")
    return f"{slug}-{kind}"[:100]
