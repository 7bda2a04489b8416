"""Shared fixtures: generated (never real) tables, isolated MLflow stores and working folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

ROOT = Path(__file__).resolve().parents[1]
CARDIO_SCHEMA = ROOT / "configs" / "cardio.yaml"
REAL_CARDIO = ROOT.parent / "shared" / "data" / "cardio_train.csv"
# Tests pass the privacy secret explicitly, for determinism; a release always draws its own.
TEST_SECRET_HEX = "5e" * 32
SMOKE_PROFILE = ROOT / "configs" / "profiles" / "smoke.yaml"
# The shipped smoke profile is a trial (it publishes nothing). Tests of publication use the same profile
# as a release that publishes, with a lifetime budget (privacy.lifetime_budget) no test reaches.
SMOKE_LIFETIME_BUDGET = 1.0e6


def publishing_smoke(folder: Path, **sections) -> str:
    """The shipped smoke profile as a publishing release profile (`trial: false`, a lifetime budget),
    with `sections` (top-level keys, mappings merged one level deep) over it, written as `folder/smoke.yaml`
    (a profile that `extends: smoke` beside it starts from it). Returns the path, for --profile."""
    profile = yaml.safe_load(SMOKE_PROFILE.read_text())
    profile["trial"] = False
    profile.setdefault("privacy", {})["lifetime_budget"] = SMOKE_LIFETIME_BUDGET
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(profile.get(key), dict):
            profile[key] = {**profile[key], **value}
        else:
            profile[key] = value
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "smoke.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return str(path)


@pytest.fixture(scope="session")
def test_secret():
    from dpsynth.models.privacy.secret import PrivacySecret

    return PrivacySecret.from_hex(TEST_SECRET_HEX)


@pytest.fixture(scope="session")
def cardio_schema():
    from dpsynth.models.data.schema import DatasetSchema

    return DatasetSchema.from_yaml(CARDIO_SCHEMA)


@pytest.fixture(scope="session")
def demo_frame(cardio_schema):
    from dpsynth.models.data.demo import make_demo_table

    return make_demo_table(cardio_schema, 3000, seed=1)


@pytest.fixture
def demo_csv(tmp_path, demo_frame, cardio_schema):
    path = tmp_path / "demo.csv"
    demo_frame.to_csv(path, sep=cardio_schema.separator, index=False)
    return path


@pytest.fixture
def smoke_release(tmp_path) -> str:
    """A publishing smoke profile (see `publishing_smoke`), as a --profile path."""
    return publishing_smoke(tmp_path / "publishing")


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    """Every test gets its own dpsynth home (ledger, stores, run folders): none touches ~/.dpsynth."""
    home = tmp_path / "dpsynth-home"
    monkeypatch.setenv("DPSYNTH_HOME", str(home))
    monkeypatch.delenv("DPSYNTH_LEDGER", raising=False)
    return home


@pytest.fixture
def isolated_workdir(tmp_path, monkeypatch):
    """Run in an empty folder that is also the home, with its own MLflow store."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("DPSYNTH_HOME", str(work))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    return work


@pytest.fixture
def one_torch_thread():
    """Torch on one thread for the test (tiny models, where thread hand-offs cost more than they save)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Markers (README, "quick checks": `python -m pytest -m "not slow and not flow"`): every test under tests/flows/
# runs a Prefect flow end to end (`flow`); `slow` marks the few other tests that take seconds each on 2 cores
# (reduced privacy audits, subprocess loads). The full suite, CI's, runs them all.
SLOW_TESTS = (
    "tests/models/test_audit.py::test_reduced_step_audit_refutes_the_old_accounting_and_not_the_current_one",
    "tests/models/test_audit.py::test_reduced_calibration_audit_has_power_and_refutes_half_the_noise",
    "tests/models/test_audit.py::test_reduced_generator_calibration_audit_has_power_and_refutes_half_the_noise",
    "tests/models/test_audit.py::test_the_release_audit_runs_end_to_end_at_a_tiny_size",
    "tests/models/test_audit.py::test_critic_draws_are_uniform_and_independent_across_rows_steps_and_a_resume",
    "tests/models/test_mechanism.py::test_sanitised_rows_are_the_gaussian_mechanism_claimed",
    "tests/models/test_release_marginals.py::test_zero_noise_is_refused_and_negligible_noise_costs_next_to_nothing",
    "tests/tasks/test_registry.py::test_registered_model_loads_in_a_fresh_process_without_dpsynth",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
        if path.startswith("tests/flows/"):
            item.add_marker(pytest.mark.flow)
        if f"{path}::{item.name.split('[')[0]}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
