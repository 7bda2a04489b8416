import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import CARDIO_SCHEMA


@pytest.fixture(autouse=True, scope="session")
def flows_use_prefect(prefect_backend):
    """Every flow test runs against the session's temporary Prefect API (tests/conftest.py)."""


@dataclass(frozen=True)
class SmokeTrial:
    """What `dpsynth release --profile smoke --json` printed, and the folder that is its home and working folder."""

    workdir: Path
    stdout: list[str]  # its lines; the last is the JSON summary
    stderr: str
    summary: dict


@pytest.fixture(scope="session")
def smoke_trial(prefect_backend, tmp_path_factory) -> SmokeTrial:
    """One smoke trial of a `dpsynth demo-data` table, run once for the session as a user runs it (the command in
    its own process, its own home and MLflow store); the tests that only read its run folder share it (through
    `in_smoke_trial`), so the fast tier runs every stage once. Nothing may write into its folder."""
    from prefect.settings import PREFECT_API_URL

    from dpsynth.flows.cli import main

    work = tmp_path_factory.mktemp("smoke-trial")
    table = work / "demo.csv"
    demo = ["demo-data", "--rows", "3000", "--seed", "1", "--out", str(table), "--config", str(CARDIO_SCHEMA)]
    assert main(demo) == 0
    env = {k: v for k, v in os.environ.items() if k != "DPSYNTH_LEDGER"}
    env.update(
        DPSYNTH_HOME=str(work),
        MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}",
        PREFECT_API_URL=str(PREFECT_API_URL.value()),  # the session's server: no second one to start
    )
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(table), "--profile", "smoke", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "dpsynth.flows.cli", *argv],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    return SmokeTrial(workdir=work, stdout=lines, stderr=done.stderr, summary=json.loads(lines[-1]))


@pytest.fixture
def in_smoke_trial(smoke_trial, monkeypatch) -> Path:
    """The test runs in the smoke trial's folder, with its home and MLflow store (as `isolated_workdir`)."""
    monkeypatch.chdir(smoke_trial.workdir)
    monkeypatch.setenv("DPSYNTH_HOME", str(smoke_trial.workdir))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{smoke_trial.workdir / 'mlflow.db'}")
    return smoke_trial.workdir


def _point_prefect_console_at(stream) -> None:
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [logging.getLogger(name) for name in logging.root.manager.loggerDict]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, PrefectConsoleHandler):
                handler.stream = stream
                handler.console.file = stream


@pytest.fixture(autouse=True)
def prefect_console_follows_capture():
    """Prefect's console handler keeps the stream it was created with; pytest closes each test's
    captured stream afterwards. Point it at the live stream for the test, and at the real one after."""
    _point_prefect_console_at(sys.stderr)
    yield
    _point_prefect_console_at(sys.__stderr__)
