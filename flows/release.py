"""The `release` flow: one privacy setting, from the input table to a chosen, evaluated generator.

validate -> split -> preprocess -> pretrain critics -> train generator -> sample checkpoints
-> model selection -> choose checkpoint. Each stage is a task that reads and writes files under the
run folder; a rerun skips the stages already done and resumes training from its last checkpoint.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from prefect import flow, get_run_logger

from flows import stages
from flows.pipeline import log_training, prepare, publish_report, setting_chain
from models.accountant import MECHANISM
from models.choice import choose_checkpoint, selection_metric
from models.errors import BudgetExceededError, ReleaseNotApprovedError
from tasks import tracking
from tasks.bundle import build_release_json
from tasks.context import load_context
from tasks.gan import sample_generator_file
from tasks.registry import release_tags
from tasks.stage import read_json, write_json


@flow(name="release")
def release(config: str, data: str, profile: str = "default", out: str | None = None) -> dict:
    log = get_run_logger()
    ctx = load_context(config, data, profile, out, kind="release")
    prof = ctx.profile
    setting = prof.release_target()
    run_id = tracking.start_run(f"{ctx.schema.name}-release", ctx.run_id,
                                {"dpsynth.kind": "release", "dpsynth.run_id": ctx.run_id,
                                 "dpsynth.data_sha256": ctx.data_hash, "dpsynth.profile": prof.name})
    try:
        tracking.log_params(run_id, {"profile": prof.to_dict(), "schema_version": ctx.schema.version})
        tracking.log_artifact(run_id, ctx.schema_path, "config")

        paths = prepare(ctx.run_dir, ctx.schema_path, ctx.schema, ctx.data_path, prof)
        tracking.log_artifact(run_id, paths["validation_summary"], "validation")
        tracking.log_artifact(run_id, paths["imputation"], "internal")
        log.info("validation: %s", paths["validation_info"])

        chain = setting_chain(ctx.run_dir, ctx.schema, paths, prof, setting)
        ledger = read_json(chain["ledger"])["checkpoints"]
        log_training(run_id, chain)
        log.info("trained %s to iteration %d, epsilon %.3f", setting.name, ledger[-1]["iteration"],
                 ledger[-1]["epsilon"])
        real = stages.select_models_real(ctx.run_dir, ctx.schema, paths["encoded"], paths["split"], prof, 1)
        results = pd.read_parquet(chain["results"])
        tracking.log_metric_series(run_id, "selection.test_auc", list(zip(results["iteration"], results["test_auc"])))
        tracking.log_artifact(run_id, chain["results"], "internal")

        metric = selection_metric(prof.protocol)
        chosen = choose_checkpoint(results, metric, prof.evaluation.auc_tolerance, prof.privacy.epsilon_budget,
                                   prof.evaluation.complete_levels,
                                   prof.evaluation.max_level_share_gap)
        if chosen is None:
            raise BudgetExceededError(
                f"No checkpoint of {setting.name!r} is both within the epsilon budget "
                f"{prof.privacy.epsilon_budget} and usable (synthetic rows of both target classes); nothing was "
                "registered or published. The internal report in the run folder shows every checkpoint.")
        floor = prof.evaluation.min_release_auc
        if floor is not None and not float(chosen[metric]) >= floor:
            raise ReleaseNotApprovedError(
                f"The best checkpoint of {setting.name!r} (iteration {int(chosen['iteration'])}) reaches AUC "
                f"{float(chosen[metric]):.3f} on {metric.replace('_', ' ')}, below the approval floor {floor}; "
                "nothing was registered or published and the previous champion stays.")
        real_auc = float(pd.read_parquet(real["results"])["test_auc"].iloc[0])
        results_path = ctx.run_dir / "results.parquet"
        pd.concat([results, pd.read_parquet(real["results"])], ignore_index=True).to_parquet(results_path, index=False)
        chosen_map = {setting.name: {"iteration": int(chosen["iteration"]), "epsilon": float(chosen["epsilon"]),
                                     "test_auc": float(chosen["test_auc"])}}
        report = publish_report(run_id, ctx.run_dir, ctx.schema_path, ctx.schema, paths, [chain], results_path,
                                chosen_map, prof, f"{ctx.schema.name} release {prof.name}")
        published = publish(ctx, prof, setting, run_id, chain, ledger, chosen, report)
        summary = {
            "release_id": ctx.run_id,
            "run_dir": str(ctx.run_dir),
            "setting": setting.name,
            "iteration": int(chosen["iteration"]),
            "epsilon": float(chosen["epsilon"]),
            "delta": prof.privacy.delta,
            "auc": float(chosen["test_auc"]),
            "real_auc": real_auc,
            "report": str(report["report"]),
            **published,
            "mlflow_run_id": run_id,
        }
        tracking.log_metrics(run_id, {"release.epsilon": summary["epsilon"], "release.auc": summary["auc"],
                                      "release.iteration": summary["iteration"], "real.auc": real_auc})
        tracking.end_run(run_id)
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in summary.items()}
    except BaseException:
        tracking.end_run(run_id, "FAILED")
        raise


def publish(ctx, prof, setting, run_id: str, chain: dict, ledger: list[dict], chosen, report) -> dict:
    """Register the chosen generator (refused over budget) and write the published bundle."""
    iteration = int(chosen["iteration"])
    generator_file = Path(chain["checkpoints"]) / next(e for e in ledger if e["iteration"] == iteration)["generator"]
    tags = release_tags(release_id=ctx.run_id, profile=prof, setting=setting, iteration=iteration,
                        data_sha256=ctx.data_hash, schema_version=ctx.schema.version,
                        release_auc=float(chosen["test_auc"]), report=str(report["report"]))
    if prof.release_rows is None:
        synthetic = pd.read_parquet(Path(chain["samples"]) / f"synthetic_{iteration:06d}.parquet")
    else:
        synthetic = sample_generator_file(generator_file, ctx.schema, prof.release_rows, seed=prof.seed)
    release_json = build_release_json(
        release_id=ctx.run_id, dataset=ctx.schema.name, schema_version=ctx.schema.version, ledger=ledger,
        chosen_iteration=iteration, delta=prof.privacy.delta,
        accountant=MECHANISM if setting.private else "none (non-private)",
        parameters={"K": setting.discriminators, "T": iteration, "batch_size": prof.gan.batch_size,
                    "sigma": prof.privacy.noise_multiplier, "C": prof.privacy.clip,
                    "sampling": "one of K disjoint subsets per step (probability 1/K), without replacement"},
        epsilon_budget=prof.privacy.epsilon_budget, rows=len(synthetic))
    bundle = stages.write_release_bundle(ctx.run_dir / "bundle", synthetic_frame=synthetic,
                                         generator_file=generator_file, release_json=release_json,
                                         release_notes_path=report[f"notes_{setting.name}"],
                                         schema_path=ctx.schema_path, separator=ctx.schema.separator)
    bundle_dir = Path(bundle["bundle"])
    # Registered last: a failure before this point leaves the champion alias where it was.
    registered = stages.register_model(
        run_id=run_id, model_name=ctx.model_name, generator_file=generator_file, schema_path=ctx.schema_path,
        tags=tags, epsilon=float(chosen["epsilon"]), epsilon_budget=prof.privacy.epsilon_budget,
        description=(f"{ctx.run_id}: setting {setting.name} (K = {setting.discriminators}), iteration {iteration}, "
                     f"epsilon {float(chosen['epsilon']):.4g} at delta {prof.privacy.delta:g}. "
                     f"Internal report: {report['report']}"))
    write_json({**read_json(bundle["release_json"]), "model_uri": registered["model_uri"]}, bundle["release_json"])
    tracking.log_artifact(run_id, bundle_dir, "bundle")
    return {"bundle_dir": str(bundle_dir), "model_uri": registered["model_uri"],
            "model_version": registered["version"]}
