import logging
import sys

import pytest


@pytest.fixture(autouse=True, scope="session")
def prefect_backend():
    """One temporary Prefect API (SQLite) for every flow test, started and stopped inside the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


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
