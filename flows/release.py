"""The `release` flow: one privacy setting, from the input table to a chosen, evaluated generator.

validate -> split -> preprocess -> pretrain critics -> train generator -> sample checkpoints
-> model selection -> choose checkpoint. Each stage is a task that reads and writes files under the
run folder; a rerun skips the stages already done and resumes training from its last checkpoint.
"""

from __future__ import annotations

import math

import pandas as pd
from prefect import flow, get_run_logger

from flows import stages
from models.choice import choose_checkpoint
from models.errors import ConfigError
from tasks import tracking
from tasks.context import load_context
from tasks.evaluate import synthetic_rows
from tasks.stage import read_json


@flow(name="release")
def release(config: str, data: str, profile: str = "default", out: str | None = None) -> dict:
    log = get_run_logger()
    ctx = load_context(config, data, profile, out, kind="release")
    prof = ctx.profile
    if len(prof.settings) != 1:
        raise ConfigError(f"Profile {prof.name!r} lists {len(prof.settings)} settings; a release trains one.")
    setting = prof.settings[0]
    run_id = tracking.start_run(f"{ctx.schema.name}-release", ctx.run_id,
                                {"dpsynth.kind": "release", "dpsynth.run_id": ctx.run_id,
                                 "dpsynth.data_sha256": ctx.data_hash, "dpsynth.profile": prof.name})
    try:
        tracking.log_params(run_id, {"profile": prof.to_dict(), "schema_version": ctx.schema.version})
        tracking.log_artifact(run_id, ctx.schema_path, "config")

        validated = stages.validate_table(ctx.run_dir, ctx.schema_path, ctx.data_path)
        tracking.log_artifact(run_id, validated["summary"], "validation")
        log.info("validation: %s", validated.info)
        split = stages.split_table(ctx.run_dir, ctx.schema, validated["table"], prof)
        prep = stages.preprocess_table(ctx.run_dir, ctx.schema, validated["table"], split["split"], prof)
        tracking.log_artifact(run_id, prep["imputation"], "internal")

        pre = stages.pretrain_critics(ctx.run_dir, ctx.schema, prep["encoded"], prep["gan_rows"], prof, setting)
        trained = stages.train_generator(ctx.run_dir, ctx.schema, prep["encoded"], prep["gan_rows"],
                                         pre.directory, prof, setting)
        ledger = read_json(trained["ledger"])["checkpoints"]
        tracking.log_metric_series(run_id, "epsilon", [(e["iteration"], e["epsilon"]) for e in ledger])
        log.info("trained %s to iteration %d, epsilon %.3f", setting.name, ledger[-1]["iteration"],
                 ledger[-1]["epsilon"])

        n_rows = synthetic_rows(prof, dict(_load_npz(split["split"])))
        samples = stages.sample_checkpoints(ctx.run_dir, ctx.schema, trained["checkpoints"], n_rows, prof, setting)
        selected = stages.select_models(ctx.run_dir, ctx.schema, prep["encoded"], split["split"], trained["ledger"],
                                        samples.directory, prof, setting.name)
        real = stages.select_models_real(ctx.run_dir, ctx.schema, prep["encoded"], split["split"], prof, 1)
        results = pd.read_parquet(selected["results"])
        tracking.log_metric_series(run_id, "selection.test_auc", list(zip(results["iteration"], results["test_auc"])))
        tracking.log_artifact(run_id, selected["results"], "internal")

        metric = "real_val_auc" if prof.protocol == "honest" else "test_auc"
        chosen = choose_checkpoint(results, metric, prof.evaluation.auc_tolerance, prof.privacy.epsilon_budget)
        real_auc = float(pd.read_parquet(real["results"])["test_auc"].iloc[0])
        summary = {
            "release_id": ctx.run_id,
            "run_dir": str(ctx.run_dir),
            "setting": setting.name,
            "iteration": int(chosen["iteration"]),
            "epsilon": float(chosen["epsilon"]),
            "delta": prof.privacy.delta,
            "auc": float(chosen["test_auc"]),
            "real_auc": real_auc,
            "mlflow_run_id": run_id,
        }
        tracking.log_metrics(run_id, {"release.epsilon": summary["epsilon"], "release.auc": summary["auc"],
                                      "release.iteration": summary["iteration"], "real.auc": real_auc})
        tracking.end_run(run_id)
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in summary.items()}
    except BaseException:
        tracking.end_run(run_id, "FAILED")
        raise


def _load_npz(path):
    import numpy as np

    return np.load(path)
