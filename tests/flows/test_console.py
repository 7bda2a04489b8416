"""What a flow command lets through to the console: our warnings and progress, not Prefect's, MLflow's or
other libraries' output unless --verbose; everything is as before once the command ends."""

import io
import logging
import os
import warnings

import pytest
from mlflow.utils.logging_utils import eprint

from dpsynth.flows.console import PREFECT_CONSOLE_LEVEL_ENV, _prefect_console_handlers, flow_console
from dpsynth.tasks.progress import MODE_ENV


@pytest.fixture
def prefect_console():
    """Prefect's console handler on the root logger, as a command line has it (under pytest, Prefect
    leaves the root logger to pytest's handlers); what it prints."""
    from prefect.logging.handlers import PrefectConsoleHandler

    printed = io.StringIO()
    handler = PrefectConsoleHandler(stream=printed)
    logging.getLogger().addHandler(handler)
    yield printed
    logging.getLogger().removeHandler(handler)


def _chatter() -> list[str]:
    """Emit what the libraries emit during a release; return the warnings that reached the console."""
    shown = []
    warnings.showwarning = lambda message, *_, **__: shown.append(str(message))
    # At WARNING: the test harness sets Prefect's loggers to WARNING (a command line's are at INFO).
    logging.getLogger("prefect").warning("Starting temporary server on http://127.0.0.1:8297")
    library = logging.getLogger("a_library")  # as great_expectations logs its temporary folders
    library.setLevel(logging.INFO)
    library.info("Created temporary directory '/tmp/x' for ephemeral docs site")
    eprint("Successfully registered model 'cardio-gswgan'.")
    # (pytest ignores FutureWarnings: a UserWarning stands in for torch.load's weights_only warning)
    warnings.warn_explicit("weights_only=False", UserWarning, "serialization.py", 1, module="torch.serialization")
    warnings.warn_explicit(
        "solver did not converge", RuntimeWarning, "selection.py", 1, module="dpsynth.models.evaluation.selection"
    )
    return shown


def test_quiet_by_default_and_restored_afterwards(prefect_console, capfd, monkeypatch):
    monkeypatch.delenv(PREFECT_CONSOLE_LEVEL_ENV, raising=False)
    assert _prefect_console_handlers()
    levels = [h.level for h in _prefect_console_handlers()]
    with warnings.catch_warnings(), flow_console(json_output=False, verbose=False):
        assert os.environ[PREFECT_CONSOLE_LEVEL_ENV] == "CRITICAL"  # worker processes inherit it
        assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
        assert MODE_ENV not in os.environ
        shown = _chatter()
    assert shown == ["solver did not converge"]
    assert prefect_console.getvalue() == "" and capfd.readouterr().err == ""
    assert PREFECT_CONSOLE_LEVEL_ENV not in os.environ
    assert [h.level for h in _prefect_console_handlers()] == levels
    eprint("Created version '1' of model 'cardio-gswgan'.")
    assert "Created version" in capfd.readouterr().err


def test_verbose_lets_everything_through_and_json_turns_progress_off(prefect_console, capfd):
    with warnings.catch_warnings(), flow_console(json_output=True, verbose=True):
        assert os.environ[MODE_ENV] == "off"
        shown = _chatter()
    assert shown == ["weights_only=False", "solver did not converge"]
    assert "Starting temporary server" in prefect_console.getvalue()
    assert "Created temporary directory" in prefect_console.getvalue()
    assert "Successfully registered model" in capfd.readouterr().err
    assert MODE_ENV not in os.environ


def test_a_users_own_prefect_console_level_stands(prefect_console, monkeypatch):
    monkeypatch.setenv(PREFECT_CONSOLE_LEVEL_ENV, "INFO")
    with warnings.catch_warnings(), flow_console(json_output=False, verbose=False):
        logging.getLogger("prefect").warning("Starting temporary server on http://127.0.0.1:8297")
    assert "Starting temporary server" in prefect_console.getvalue()
    assert os.environ[PREFECT_CONSOLE_LEVEL_ENV] == "INFO"
