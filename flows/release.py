"""The `release` flow: one privacy setting, from the input table to a published, registered generator.

validate -> split -> preprocess -> pretrain critics -> train generator -> sample checkpoints
-> model selection -> DP choice of the checkpoint and DP approval -> report, bundle, registry.
Each stage is a task that reads and writes files under the run folder; a rerun of an interrupted run
skips the stages already done and resumes training from its last checkpoint, with the run's secret.

A trial (a profile with `trial: true`, or `publish=False`: `dpsynth release --no-publish`) runs the same
stages up to the DP decision and the internal report, and publishes nothing: no registration, no
bundle, no alias moved, no entry in the table's privacy ledger (so no lifetime check either). Anything
else publishes, and only with a profile that sets `privacy.lifetime_budget`.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from prefect import flow, get_run_logger

from dpsynth.flows import stages
from dpsynth.flows.console import quiet_mlflow
from dpsynth.flows.pipeline import log_training, prepare, publish_report, setting_chain
from dpsynth.models.config import Profile, Setting
from dpsynth.models.defaults import DEFAULT_RELEASE_PROFILE
from dpsynth.models.errors import ReleaseNotApprovedError
from dpsynth.models.privacy.release_choice import ReleaseDecision
from dpsynth.models.privacy.secret import load as load_secret
from dpsynth.tasks import ledger as ledger_mod
from dpsynth.tasks import tracking
from dpsynth.tasks.background import Background
from dpsynth.tasks.context import (
    REAL_TABLE_TRIAL,
    RunContext,
    close_run,
    finished_summary,
    is_demo_table,
    load_context,
    open_run,
    read_run_record,
    remember,
)
from dpsynth.tasks.decision import decide, planned_cost, planned_release_cost, release_cost_of
from dpsynth.tasks.ledger import (
    check_lifetime,
    check_new_input,
    check_release_window,
    require_lifetime_budget,
)
from dpsynth.tasks.progress import stage, status
from dpsynth.tasks.stage import StageResult, read_json, write_json
from dpsynth.tasks.validate import repairs_of

if TYPE_CHECKING:
    from dpsynth.tasks.public_release import PublicRelease

# What only the stages after training use (torch, scikit-learn, MLflow's registry) is imported where it is
# used: loading this flow then loads none of them, and its first stage starts sooner (bench/startup.py).


@flow(name="release")
def release(
    config: str,
    data: str,
    profile: str = DEFAULT_RELEASE_PROFILE,
    out: str | None = None,
    generator: str | None = None,
    publish: bool = True,
    allow_same_input: bool = False,
    cluster: str | None = None,
) -> dict:
    """`cluster`: a Dask scheduler's address; a marginal generator's training rows are counted by its
    workers (tasks/cell_counting.py), to the same counts; the secret and the noise stay here."""
    log = get_run_logger()
    ctx = load_context(config, data, profile, out, kind="release", generator=generator, publish=publish)
    done = finished_summary(ctx)
    if done is not None:
        log.info(
            "release %s had already finished (%s): every stage reused, nothing new tracked or registered",
            ctx.run_id,
            done.get("model_uri") or "a trial: nothing published",
        )
        return done
    prof = ctx.profile
    trial = prof.trial
    setting = prof.release_target()
    # Again here, not only in the command line's preflight: a deployment enters at this flow.
    require_lifetime_budget(prof)
    planned_cost(prof, setting, release=True, schema=ctx.schema)
    if not trial:
        check_lifetime(ctx.schema.name, planned_release_cost(prof, setting), prof.privacy.lifetime_budget, ctx.run_id)
        check_release_window(ctx.schema.name, prof, ctx.run_id)
        if not allow_same_input:
            check_new_input(ctx.schema.name, ctx.data_hash, ctx.run_id)
    elif not is_demo_table(ctx.data_path, ctx.data_hash):
        log.warning("%s", REAL_TABLE_TRIAL)
    open_run(ctx)
    entered = False
    resume = (read_run_record(ctx.run_dir) or {}).get("mlflow_run_id")

    def open_mlflow_run() -> str:
        quiet_mlflow()  # the command's quiet console: MLflow's own logs off, before it is first used
        run_id = tracking.start_run(
            f"{ctx.schema.name}-release",
            ctx.run_id,
            {
                "dpsynth.kind": "release",
                "dpsynth.run_id": ctx.run_id,
                "dpsynth.data_sha256": ctx.data_hash,
                "dpsynth.profile": prof.name,
                "dpsynth.trial": str(trial).lower(),
            },
            resume=resume,
        )
        remember(ctx, mlflow_run_id=run_id)  # at once: a rerun after a crash resumes this MLflow run
        return run_id

    # Importing MLflow and creating a new home's store take seconds: they run alongside the first stages
    # (which log nothing), and the run is waited for before anything is logged or trained.
    mlflow_run = Background(open_mlflow_run, "dpsynth-mlflow-run")
    try:
        paths = prepare(ctx.run_dir, ctx.schema_path, ctx.schema, ctx.data_path, prof)
        if not mlflow_run.done:
            status("opening the MLflow run")
        run_id = mlflow_run.result()
        tracking.log_params(run_id, {"profile": prof.to_dict(), "schema_version": ctx.schema.version})
        tracking.log_artifact(run_id, ctx.schema_path, "config")
        tracking.log_artifact(run_id, paths["validation_summary"], "validation")
        tracking.log_artifact(run_id, paths["imputation"], "internal")
        log.info("validation: %s", paths["validation_info"])

        chain = setting_chain(ctx.run_dir, ctx.schema, paths, prof, setting, cluster=cluster)
        ledger = read_json(chain["ledger"])["checkpoints"]
        log_training(run_id, chain)
        log.info(
            "trained %s to iteration %d, training epsilon %.3f",
            setting.name,
            ledger[-1]["iteration"],
            ledger[-1]["epsilon"],
        )
        real = stages.select_models_real(ctx.run_dir, ctx.schema, paths["encoded"], paths["split"], prof, 1)
        results = pd.read_parquet(chain["results"])
        tracking.log_metric_series(
            run_id, "selection.test_auc", list(zip(results["iteration"], results["test_auc"], strict=False))
        )
        tracking.log_artifact(run_id, chain["results"], "internal")

        choice = decide(
            results,
            ledger,
            prof,
            setting,
            release=True,
            schema=ctx.schema,
            encoded_path=paths["encoded"],
            split_path=paths["split"],
            secret=load_secret(ctx.run_dir),
        )
        assert choice is not None and choice.release is not None  # a release always takes the DP decision
        decision = choice.release
        write_json(decision.__dict__, ctx.run_dir / "decision.json")
        if not trial:
            # Entered before anything about the decision shows: a refusal costs what a release does, and a
            # release past the table's lifetime budget is refused whatever the decision was.
            ledger_mod.enter(
                ctx.schema.name,
                ctx.run_id,
                release_cost_of(prof, setting, ledger[-1]["iteration"], decision.epsilon),
                prof.privacy.lifetime_budget,
                status="publishing" if decision.approved else "refused",
                input_sha256=ctx.data_hash,
                profile=prof.name,
            )
            entered = decision.approved
        tracking.log_metrics(
            run_id,
            {
                "release.epsilon": decision.epsilon,
                "release.iteration": decision.iteration,
                "release.epsilon_training": decision.epsilon_training,
                "release.epsilon_choice": decision.epsilon_choice,
            },
        )
        # Known from here: the epsilon this run spends, in its name and description (rounded; exact in metrics).
        record = public_record(ctx, prof, setting, chain, ledger, decision)
        tracking.describe_run(
            run_id,
            tracking.release_run_name(record, trial),
            tracking.release_run_description(
                record,
                trial,
                "approved by the DP approval test"
                if decision.approved
                else "refused by the DP approval test: nothing published",
            ),
        )
        if not decision.approved:
            outcome = (
                "this trial published nothing and entered nothing in the privacy ledger; a release with "
                "this profile would have been refused, at epsilon"
                if trial
                else "nothing was registered or published and the previous champion stays. The decision spent epsilon"
            )
            raise ReleaseNotApprovedError(
                f"The differentially private approval test found the checkpoint of {setting.name!r} drawn for "
                f"release (iteration {decision.iteration}) below the approval floor "
                f"{prof.evaluation.min_release_auc} (AUC on real validation rows, with noise); {outcome} "
                f"{decision.epsilon:.4g}."
            )
        chosen = results[results["iteration"] == decision.iteration].iloc[0]
        auc = float(chosen["test_auc"])
        real_auc = float(pd.read_parquet(real["results"])["test_auc"].iloc[0])
        results_path = ctx.run_dir / "results.parquet"
        pd.concat([results, pd.read_parquet(real["results"])], ignore_index=True).to_parquet(results_path, index=False)
        chosen_map = {setting.name: {"iteration": decision.iteration, "epsilon": decision.epsilon, "test_auc": auc}}
        # `record`: everything the release publishes about itself, built and guarded once: the notes, the
        # bundle and the registry render it (a trial renders its notes only).
        report = publish_report(
            run_id,
            ctx.run_dir,
            ctx.schema_path,
            ctx.schema,
            paths,
            [chain],
            results_path,
            chosen_map,
            prof,
            f"{ctx.schema.name} release {prof.name}",
            release=True,
            public_release=record,
        )
        # Internal facts (the data hash is a tag since the run started) stay on the internal run only.
        tracking.set_tags(run_id, {"dpsynth.report": str(report["report"])})
        # A trial stops here: nothing registered, no bundle, no alias moved, nothing in the ledger. Its
        # chosen generator stays in the run folder, for the steward's eyes only (dpsynth.Release.sampler).
        published = (
            {
                "published": False,
                "trial": True,
                "generator_file": str(released_generator_file(ctx, chain, ledger, decision, folder="trial")),
            }
            if trial
            else {
                "published": True,
                "trial": False,
                **publish_release(ctx, record, run_id, chain, ledger, decision, report),
            }
        )
        summary = {
            "release_id": ctx.run_id,
            "run_dir": str(ctx.run_dir),
            "setting": setting.name,
            "iteration": decision.iteration,
            "epsilon": decision.epsilon,
            "epsilon_training": decision.epsilon_training,
            "epsilon_choice": decision.epsilon_choice,
            "delta": prof.privacy.delta,
            "auc": auc,
            "real_auc": real_auc,
            "report": str(report["report"]),
            **published,
            "mlflow_run_id": run_id,
            # Internal (real rows): what validation repaired in the input, and the internal report's
            # fidelity figures per setting.
            "input_repairs": repairs_of(read_json(paths["validation_summary"])),
            "fidelity": read_json(report.outputs["fidelity"]) if "fidelity" in report.outputs else {},
        }
        status("logging the results")
        tracking.log_metrics(run_id, {"release.auc": auc, "real.auc": real_auc})
        tracking.describe_run(
            run_id,
            tracking.release_run_name(record, trial),
            tracking.release_run_description(
                record,
                trial,
                "a trial: nothing published (no registration, bundle or ledger entry)"
                if trial
                else f"published as `{published['model_uri']}` (alias champion); the run's logged model "
                "`released-generator` is the same generator",
                bundle_dir=None if trial else str(published["bundle_dir"]),
                report=str(report["report"]),
            ),
        )
        if not trial:
            ledger_mod.mark_published(ctx.run_id, f"{ctx.model_name}/{published['model_version']}")
        summary = {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in summary.items()}
        remember(ctx, summary=summary)
        close_run(ctx, "trial" if trial else "published")
        tracking.end_run(run_id)
        return summary
    except ReleaseNotApprovedError:
        # The DP decision's answer is final for this run (rerunning it would draw no new noise).
        close_run(ctx, "trial-refused" if trial else "refused")
        tracking.end_run(mlflow_run.result(), "FAILED")
        raise
    except BaseException:
        if entered:
            from dpsynth.tasks.registry import release_registered

            if not release_registered(ctx.model_name, ctx.run_id):
                # Nothing was registered: no bundle may lie around to be copied out uncounted, and the
                # release costs nothing.
                shutil.rmtree(ctx.run_dir / "bundle", ignore_errors=True)
                ledger_mod.withdraw(ctx.run_id)
        # The MLflow run, if it opened (a first stage may fail before it has): its record is written first.
        opened = mlflow_run.settled()
        close_run(ctx, "failed")
        if opened is not None:
            tracking.end_run(opened, "FAILED")
        raise


def released_generator_file(
    ctx: RunContext, chain: dict, ledger: list[dict], decision: ReleaseDecision, folder: str = "release"
) -> Path:
    """The chosen checkpoint's generator, stamped with the whole release's epsilon (the checkpoint file
    records training's epsilon at that iteration only), in the run folder's `folder` (a trial's: trial/,
    so that nothing in it looks published)."""
    import torch

    from dpsynth.models.checkpoint_files import load_verified
    from dpsynth.models.generators.samplers import FORMAT_VERSION_KEY, GENERATOR_FORMAT_VERSION

    entry = next(e for e in ledger if e["iteration"] == decision.iteration)
    source = Path(chain["checkpoints"]) / entry["generator"]
    blob = load_verified(source, entry.get("sha256"), map_location="cpu", weights_only=False)
    # The ledger's epsilon is replace-one for every generator (a DP-SGD checkpoint file records Opacus's
    # add/remove-one figure, never published); the file says which generator wrote it, for sampling.
    blob = {k: v for k, v in blob.items() if k not in ("epsilon", "adjacency")}
    blob.update(
        {
            # Readers refuse a format newer than they know (models/generators/samplers.py).
            FORMAT_VERSION_KEY: GENERATOR_FORMAT_VERSION,
            "generator_type": chain["generator"],
            "iteration": decision.iteration,
            "epsilon": decision.epsilon,
            "epsilon_training_at_checkpoint": entry["epsilon"],
            "epsilon_training": decision.epsilon_training,
            "epsilon_choice": decision.epsilon_choice,
        }
    )
    target = ctx.run_dir / folder / "generator.pt"
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(blob, target)
    return target


def public_record(
    ctx: RunContext, prof: Profile, setting: Setting, chain: dict, ledger: list[dict], decision: ReleaseDecision
) -> PublicRelease:
    """The release's public record, from the DP decision, the profile and the chosen checkpoint's file
    (the measured marginals' public numbers: the released generator carries the same)."""
    from dpsynth.tasks.marginals import released_parameters
    from dpsynth.tasks.public_release import build_public_release

    entry = next(e for e in ledger if e["iteration"] == decision.iteration)
    measured = released_parameters(Path(chain["checkpoints"]) / entry["generator"])
    return build_public_release(
        release_id=ctx.run_id,
        model_name=ctx.model_name,
        schema=ctx.schema,
        profile=prof,
        setting=setting,
        decision=decision,
        ledger=ledger,
        measured=measured,
    )


def publish_release(
    ctx: RunContext,
    record: PublicRelease,
    run_id: str,
    chain: dict,
    ledger: list[dict],
    decision: ReleaseDecision,
    report: StageResult,
) -> dict:
    """Register the chosen generator (refused over budget) and write the published bundle, both rendered
    from the release's public record."""
    from dpsynth.tasks.bundle import record_model_uri
    from dpsynth.tasks.registry import release_description, release_tags
    from dpsynth.tasks.training import sample_generator_file

    generator_file = released_generator_file(ctx, chain, ledger, decision)
    # A public number of rows, sampled afresh: the checkpoint's own sample has as many rows as the training
    # split, a count epsilon does not cover.
    with stage("sample the release rows"):
        synthetic = sample_generator_file(generator_file, ctx.schema, record.rows, seed=ctx.profile.seed)
    bundle = stages.write_release_bundle(
        ctx.run_dir / "bundle",
        record,
        synthetic_frame=synthetic,
        generator_file=generator_file,
        release_notes_path=report[f"notes_{record.setting}"],
        schema_path=ctx.schema_path,
    )
    bundle_dir = Path(bundle["bundle"])
    # Registered last: a failure before this point leaves the champion alias where it was.
    registered = stages.register_model(
        run_id=run_id,
        model_name=record.model_name,
        generator_file=generator_file,
        schema_path=ctx.schema_path,
        tags=release_tags(record),
        epsilon=record.epsilon,
        epsilon_budget=record.epsilon_budget,
        description=release_description(record),
    )
    record_model_uri(bundle_dir, registered["model_uri"])
    status("logging the bundle")
    tracking.log_artifact(run_id, bundle_dir, "bundle")
    return {
        "bundle_dir": str(bundle_dir),
        "model_uri": registered["model_uri"],
        "model_version": registered["version"],
        "generator_file": str(generator_file),
    }
