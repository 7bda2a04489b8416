"""The `experiment` flow: the thesis grid (Algorithm 3), every setting in parallel.

validate -> split -> preprocess once; then, as independent tasks on the task runner: per setting
pretrain -> train -> sample, and one model-selection task per checkpoint of each setting and per index
of the real-vs-real baseline. The task runner is a process pool of the profile's `workers` on one
machine, or a Dask cluster when the profile names a scheduler address (`task_runner_for`).

`experiment` is what the command line and the `thesis-experiment` deployment both run: it reads the
profile, picks the task runner and runs the grid (`experiment-grid`) on it as a subflow. A flow's task
runner is fixed before its body starts, so the choice cannot live inside the grid flow itself.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, as_completed
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner

from dpsynth.flows import stages
from dpsynth.flows.pipeline import log_training, prepare, publish_report, train_chain, wait_showing_progress
from dpsynth.models.config import Profile, Setting, load_profile
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators import generator_for
from dpsynth.models.privacy.secret import load as load_secret
from dpsynth.tasks import tracking
from dpsynth.tasks.context import (
    close_run,
    finished_summary,
    load_context,
    open_run,
    read_run_record,
    remember,
)
from dpsynth.tasks.decision import decide
from dpsynth.tasks.evaluate import checkpoint_runs, collect_runs, real_runs
from dpsynth.tasks.stage import read_json, write_json


def plan(profile: Profile) -> dict:
    """What the grid will run: every setting's checkpoints (its generator's plan, within its budget), a
    selection run per checkpoint, and the real baseline's runs (as many as the largest setting's)."""
    plans = {s.name: generator_for(profile, s).plan(profile, s) for s in profile.settings}
    checkpoints = {name: len(p.iterations) for name, p in plans.items()}
    most = max(checkpoints.values())
    real_runs = most if profile.evaluation.real_baseline else 0
    return {
        "profile": profile.name,
        "settings": list(plans),
        "checkpoints_per_setting": most,
        "checkpoints": checkpoints,
        "selection_runs": sum(checkpoints.values()) + real_runs,
        "generators": {s.name: profile.generator_of(s) for s in profile.settings},
        "last_iterations": {name: p.last for name, p in plans.items()},
        "discriminators": [s.discriminators for s in profile.settings],
        # Work before training, in each generator's own units (GS-WGAN: pretraining iterations per critic).
        "prepare_units": {s.name: generator_for(profile, s).prepare_units(profile) for s in profile.settings},
    }


def _one_thread_per_worker() -> None:
    # Two workers on two cores: each process keeps to one thread instead of oversubscribing.
    import torch

    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"


# TaskRunner[Any]: Prefect's TaskRunner is invariant in its future type, so flow() and with_options(), which
# take a TaskRunner[PrefectFuture[Any]], accept no concrete runner's own type.
def _process_pool(workers: int) -> TaskRunner[Any]:
    return ProcessPoolTaskRunner(max_workers=max(1, workers), initializer=_one_thread_per_worker)


def task_runner_for(prof: Profile) -> TaskRunner[Any]:
    """The experiment's task runner for a profile: its Dask cluster when it names a scheduler address,
    otherwise a process pool of its `workers`. The one place this is decided, for every way of running."""
    if prof.dask_address:
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=prof.dask_address)
    return _process_pool(prof.workers)


def expected_cost(setting: Setting) -> int:
    """Start order: GS-WGAN's pretraining grows with K; the other generators have none."""
    return setting.discriminators or 0


@task(name="train-setting", cache_policy=NO_CACHE, persist_result=False)
def run_training(run_dir: Path, schema: DatasetSchema, paths: dict, profile: Profile, setting: Setting) -> dict:
    return train_chain(run_dir, schema, paths, profile, setting)


# The pool here only serves a direct call of the grid; `experiment` always replaces it with the profile's.
@flow(name="experiment-grid", task_runner=_process_pool(2))
def experiment_grid(
    config: str, data: str, profile: str = "thesis", out: str | None = None, generator: str | None = None
) -> dict:
    log = get_run_logger()
    ctx = load_context(config, data, profile, out, kind="experiment", generator=generator)
    done = finished_summary(ctx)
    if done is not None:
        log.info("experiment %s already completed: every stage reused, nothing new tracked", ctx.run_id)
        return done
    prof = ctx.profile
    open_run(ctx)
    run_id = tracking.start_run(
        f"{ctx.schema.name}-experiment",
        ctx.run_id,
        {
            "dpsynth.kind": "experiment",
            "dpsynth.run_id": ctx.run_id,
            "dpsynth.data_sha256": ctx.data_hash,
            "dpsynth.profile": prof.name,
        },
        resume=(read_run_record(ctx.run_dir) or {}).get("mlflow_run_id"),
    )
    remember(ctx, mlflow_run_id=run_id)
    try:
        tracking.log_params(run_id, {"profile": prof.to_dict()})
        paths = prepare(ctx.run_dir, ctx.schema_path, ctx.schema, ctx.data_path, prof)
        the_plan = plan(prof)
        # Fan-out: settings train in parallel; every selection run (each checkpoint of each setting, each
        # index of the real baseline) is its own task on the same runner. Settings start largest K first
        # (pretraining grows with K, training does not), so the workers run out of work at about the
        # same time; a setting's selection runs are submitted as soon as its training ends.
        # On one machine only `workers` settings are in flight and the next largest is submitted as one
        # ends: tasks submitted at once reach the process pool in no fixed order (a thesis run started
        # K = 250 before K = 500 and ended with one worker alone on K = 500 for 10 minutes).
        waiting = sorted(prof.settings, key=expected_cost, reverse=True)
        in_flight = len(waiting) if prof.dask_address else max(1, prof.workers)

        def submit_next_setting() -> PrefectFuture[dict]:
            return run_training.submit(ctx.run_dir, ctx.schema, paths, prof, waiting.pop(0))

        running = [submit_next_setting() for _ in range(min(in_flight, len(waiting)))]
        enc, split = paths["encoded"], paths["split"]
        real_futures = []
        if prof.evaluation.real_baseline:
            real_futures = [
                stages.select_model.submit(ctx.run_dir, ctx.schema, enc, split, prof, "real", **run)
                for run in real_runs(prof, the_plan["checkpoints_per_setting"])
            ]
        finished, submitted = {}, {}
        while running:
            future = next(as_completed(running))
            running.remove(future)
            if waiting:
                running.append(submit_next_setting())
            chain = future.result()
            finished[chain["setting"]] = chain
            submitted[chain["setting"]] = [
                stages.select_model.submit(ctx.run_dir, ctx.schema, enc, split, prof, chain["setting"], **run)
                for run in checkpoint_runs(chain["ledger"], chain["samples"])
            ]
        chains = [finished[s.name] for s in prof.settings]
        selections = [submitted[s.name] for s in prof.settings]
        wait_showing_progress([f for fs in selections for f in fs] + real_futures, "model selection")
        for chain in chains:
            log_training(run_id, chain)
        frames = []
        for chain, futures in zip(chains, selections, strict=False):
            table = collect_runs(
                [f.result()["run"] for f in futures], ctx.run_dir / f"evaluate-{chain['setting']}" / "selection.parquet"
            )
            chain["results"] = table
            frames.append(pd.read_parquet(table))
        if real_futures:
            table = collect_runs(
                [f.result()["run"] for f in real_futures], ctx.run_dir / "evaluate-real" / "selection.parquet"
            )
            frames.append(pd.read_parquet(table))
        results = pd.concat(frames, ignore_index=True)
        results_path = ctx.run_dir / "results.parquet"
        results.to_parquet(results_path, index=False)
        tracking.log_artifact(run_id, results_path, "internal")

        chosen = {}
        secret = load_secret(ctx.run_dir)
        for s, chain in zip(prof.settings, chains, strict=False):
            pick = decide(
                results,
                read_json(chain["ledger"])["checkpoints"],
                prof,
                s,
                release=False,
                schema=ctx.schema,
                encoded_path=paths["encoded"],
                split_path=paths["split"],
                secret=secret,
            )
            if pick is not None:
                chosen[s.name] = pick.as_dict()
                tracking.log_metrics(run_id, {f"{s.name}.auc": pick.test_auc, f"{s.name}.epsilon": pick.epsilon})
        report = publish_report(
            run_id,
            ctx.run_dir,
            ctx.schema_path,
            ctx.schema,
            paths,
            chains,
            results_path,
            chosen,
            prof,
            f"{ctx.schema.name} experiment {prof.name}",
        )
        real_auc = float(results.loc[results["setting"] == "real", "test_auc"].mean()) if real_futures else None
        summary = {
            "experiment_id": ctx.run_id,
            "run_dir": str(ctx.run_dir),
            "selection_runs": len(results),
            "planned_selection_runs": the_plan["selection_runs"],
            "real_auc": real_auc,
            "chosen": {
                k: {kk: (None if isinstance(vv, float) and math.isinf(vv) else vv) for kk, vv in v.items()}
                for k, v in chosen.items()
            },
            "results": str(results_path),
            "report": str(report["report"]),
            "mlflow_run_id": run_id,
        }
        if "comparison" in report.outputs:  # settings on more than one generator (profile `compare`)
            summary["comparison"] = read_json(report["comparison"])
        write_json(summary, ctx.run_dir / "summary.json")
        tracking.set_tags(
            run_id,
            {
                tracking.RUN_NOTE_TAG: f"**Experiment** `{ctx.run_id}` of table `{ctx.schema.name}`, profile "
                f"`{prof.name}`: {len(prof.settings)} settings, {len(results)} selection runs; nothing published.\n\n"
                f"- internal report: `{report['report']}`"
            },
        )
        remember(ctx, summary=summary)
        log.info("experiment %s: %d selection runs", ctx.run_id, len(results))
        close_run(ctx, "completed")
        tracking.end_run(run_id)
        return summary
    except BaseException:
        close_run(ctx, "failed")
        tracking.end_run(run_id, "FAILED")
        raise


@flow(name="experiment")
def experiment(
    config: str, data: str, profile: str = "thesis", out: str | None = None, generator: str | None = None
) -> dict:
    """Run the experiment grid on the task runner the profile asks for (Dask when it names a scheduler)."""
    runner = task_runner_for(load_profile(profile, config))
    return experiment_grid.with_options(task_runner=runner)(
        config=config, data=data, profile=profile, out=out, generator=generator
    )


# The command line's name for the same flow: `dpsynth experiment` and the deployment run one code path.
experiment_for_profile = experiment
