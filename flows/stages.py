"""The stage functions of tasks/ as Prefect tasks. Our own manifests decide what is already done, so
Prefect's input-hash caching is off (it hashes DataFrames and tensors non-deterministically anyway).

Each task is made when the flow first uses it (`__getattr__`, below), so that loading the flow loads
Prefect and none of the stages' libraries: `validate` starts without torch, scikit-learn, matplotlib or
MLflow having been imported (bench/startup.py measures the start-up), and each later stage imports its
own module as it starts.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from dpsynth.tasks.private_files import owner_only
from dpsynth.tasks.progress import stage

# Each stage's line on the progress display (the command's process only: worker processes show none).
STAGE_LABELS = {
    "validate": "validate",
    "split": "split",
    "preprocess": "preprocess",
    "measure-marginals": "marginals",
    "attach-marginals": "marginals (attach)",
    "prepare-training": "prepare",
    "train-generator": "train",
    "sample-checkpoints": "sample",
    "select-models": "select",
    "select-models-real": "select (real baseline)",
    "select-model": "select",
    "report": "report",
    "register-model": "registration",
    "write-bundle": "bundle",
}

P = ParamSpec("P")
R = TypeVar("R")


# Every stage function declares what it returns: for one returning Any, Prefect's Task.__call__ overloads
# would pick the coroutine one (its results would read as coroutines).
def _task(fn: Callable[P, R], name: str) -> Task[P, R]:
    @functools.wraps(fn)
    def owner_only_stage(*args: P.args, **kwargs: P.kwargs) -> R:
        # A task may run in a worker process (process pool, Dask) that never passed through the CLI.
        owner_only()
        with stage(STAGE_LABELS[name]):
            return fn(*args, **kwargs)

    return task(name=name, cache_policy=NO_CACHE, persist_result=False, log_prints=True)(owner_only_stage)


# Each task's name: (its module under dpsynth.tasks, its stage function, its Prefect task name).
STAGE_FUNCTIONS = {
    "validate_table": ("validate", "validate_stage", "validate"),
    "split_table": ("split", "split_stage", "split"),
    "preprocess_table": ("preprocess", "preprocess_stage", "preprocess"),
    "measure_marginals": ("marginals", "measure_stage", "measure-marginals"),
    "attach_marginals": ("marginals", "attach_stage", "attach-marginals"),
    "prepare_training": ("training", "prepare_stage", "prepare-training"),
    "train_generator": ("training", "train_stage", "train-generator"),
    "sample_checkpoints": ("training", "sample_stage", "sample-checkpoints"),
    "select_models": ("evaluate", "evaluate_setting_stage", "select-models"),
    "select_models_real": ("evaluate", "evaluate_real_stage", "select-models-real"),
    "select_model": ("evaluate", "selection_run_stage", "select-model"),
    "write_report": ("reporting", "report_stage", "report"),
    "register_model": ("registry", "register_release", "register-model"),
    "write_release_bundle": ("bundle", "write_bundle", "write-bundle"),
}


def __getattr__(name: str) -> Any:
    """The task `name`, made (and its module imported) on first use, then kept in the module."""
    if name not in STAGE_FUNCTIONS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, function, task_name = STAGE_FUNCTIONS[name]
    made = _task(getattr(importlib.import_module(f"dpsynth.tasks.{module}"), function), task_name)
    globals()[name] = made
    return made


if TYPE_CHECKING:  # the tasks' types, for the type checker: what `__getattr__` makes
    from dpsynth.tasks import bundle, evaluate, marginals, preprocess, registry, reporting, split, training, validate

    validate_table = _task(validate.validate_stage, "validate")
    split_table = _task(split.split_stage, "split")
    preprocess_table = _task(preprocess.preprocess_stage, "preprocess")
    measure_marginals = _task(marginals.measure_stage, "measure-marginals")
    attach_marginals = _task(marginals.attach_stage, "attach-marginals")
    prepare_training = _task(training.prepare_stage, "prepare-training")
    train_generator = _task(training.train_stage, "train-generator")
    sample_checkpoints = _task(training.sample_stage, "sample-checkpoints")
    select_models = _task(evaluate.evaluate_setting_stage, "select-models")
    select_models_real = _task(evaluate.evaluate_real_stage, "select-models-real")
    select_model = _task(evaluate.selection_run_stage, "select-model")
    write_report = _task(reporting.report_stage, "report")
    register_model = _task(registry.register_release, "register-model")
    write_release_bundle = _task(bundle.write_bundle, "write-bundle")
