"""The memory-heavy stages run in a child process (tasks/child_process.py, flows/stages.py), so that their
memory goes back to the machine when they end: same result as in the release process, same files, and an
error in the child surfaces as the same readable error."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from dpsynth.flows import stages
from dpsynth.models.config import Profile, Setting
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError
from dpsynth.models.privacy.secret import PrivacySecret, store
from dpsynth.tasks.child_process import in_child_process
from dpsynth.tasks.evaluate import evaluate_real_stage
from dpsynth.tasks.preprocess import preprocess_stage
from dpsynth.tasks.split import split_stage
from dpsynth.tasks.validate import validate_stage
from tests.conftest import CARDIO_SCHEMA, TEST_SECRET_HEX

PROFILE = Profile(name="child", settings=(Setting("k10", 10),))


def test_the_memory_heavy_stages_of_a_release_run_in_another_process():
    for name in ("preprocess", "prepare-training", "sample-checkpoints", "select-models", "select-models-real"):
        assert stages._task(os.getpid, name).fn() != os.getpid(), name
    assert stages._task(os.getpid, "train-generator").fn() == os.getpid()  # its progress bar: here


def test_an_error_in_the_child_is_the_same_readable_error(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match=f"^Schema file '{missing}' does not exist.$"):
        in_child_process(DatasetSchema.from_yaml, missing)


def test_preprocess_and_evaluation_in_a_child_write_the_same_files(tmp_path, cardio_schema, demo_csv):
    here, child = tmp_path / "here", tmp_path / "child"
    store(here, PrivacySecret.from_hex(TEST_SECRET_HEX))
    validated = validate_stage(here, CARDIO_SCHEMA, demo_csv)
    split = split_stage(here, cardio_schema, validated["table"], PROFILE)
    shutil.copytree(here, child)
    outputs = {}
    for run_dir, run in ((here, lambda fn, *a: fn(*a)), (child, in_child_process)):
        table, split_path = run_dir / "validate" / validated["table"].name, run_dir / "split" / split["split"].name
        prep = run(preprocess_stage, run_dir, cardio_schema, table, split_path, PROFILE)
        real = run(evaluate_real_stage, run_dir, cardio_schema, prep["encoded"], split_path, PROFILE, 1)
        outputs[run_dir] = (prep, real)
    (prep_here, real_here), (prep_child, real_child) = outputs[here], outputs[child]
    assert prep_child.directory == child / "preprocess" and not prep_child.skipped
    for key in ("encoded", "complete", "gan_rows", "imputation"):
        assert prep_here[key].read_bytes() == prep_child[key].read_bytes(), key
    record_here, record_child = (
        json.loads((r["results"].parent / "000" / "run.json").read_text()) for r in (real_here, real_child)
    )
    assert np.isfinite(record_child["test_auc"])
    assert {k: v for k, v in record_here.items() if "seconds" not in k} == {
        k: v for k, v in record_child.items() if "seconds" not in k
    }
