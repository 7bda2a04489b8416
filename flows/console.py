"""What a flow command shows on standard error: our progress display (tasks/progress.py, opened here for
the whole command, from before the libraries load) and our error messages, not the libraries' chatter,
unless `--verbose`.

Left to themselves, a release's libraries write to the console: Prefect logs every task run
("Finished in state Completed()"), its temporary server's address and a hint about running a server,
and the traceback of an error the command line then explains in one paragraph; MLflow logs its
database migrations and a pickle caution, prints "Successfully registered model" and draws artifact
download bars; Great Expectations logs its temporary folders; libraries raise FutureWarnings.
`quiet_console` turns these off for one command and restores everything afterwards (flows also run
in-process, from tests and notebooks). The settings go through the environment too, so the worker
processes the experiment flow starts follow them. Prefect still sends its logs to its API.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from dpsynth.tasks.environment import environment
from dpsynth.tasks.progress import MODE_ENV, open_display

# Prefect's console handler (its logging.yml `handlers.console`), overridable from the environment.
PREFECT_CONSOLE_LEVEL_ENV = "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"
MLFLOW_BARS_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
# Warnings raised from our own packages still show; everyone else's only under --verbose.
OUR_MODULES = r"dpsynth(\.|$)"


@contextmanager
def flow_console(json_output: bool, verbose: bool) -> Iterator[None]:
    """For one `release` or `experiment` command: progress off under --json (standard error then
    carries errors only), one plain line per update under --verbose (in-place rewriting would fight
    the libraries' log lines), and third-party output off unless --verbose."""
    mode = "off" if json_output else ("lines" if verbose else None)
    with environment({MODE_ENV: mode}), open_display():
        if verbose:
            yield
        else:
            with quiet_console():
                yield


# The open quiet console's pending MLflow switch (`quiet_mlflow`), entered when MLflow is first needed.
_mlflow_pending: list[contextlib.ExitStack] = []


def quiet_mlflow() -> None:
    """Turn MLflow's event logs off for the rest of the open quiet console (nothing outside one, or once
    done). Called just before MLflow is first used: importing it takes seconds, which a command refused
    by its preflight should not spend."""
    if _mlflow_pending:
        _mlflow_pending.pop().enter_context(_mlflow_event_logs_off())


@contextmanager
def quiet_console() -> Iterator[None]:
    # Prefect's ERROR logs of a failed run repeat, as a traceback, what the command line says in one
    # paragraph (and a bug's traceback reaches the console anyway): only CRITICAL passes.
    with (
        environment({PREFECT_CONSOLE_LEVEL_ENV: "CRITICAL", MLFLOW_BARS_ENV: "false"}, keep_users=True),
        _prefect_console_level(logging.CRITICAL),
        contextlib.ExitStack() as mlflow_later,
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore")
        warnings.filterwarnings("default", module=OUR_MODULES)
        if "mlflow" in sys.modules:  # loaded already: no reason to wait
            mlflow_later.enter_context(_mlflow_event_logs_off())
        else:
            _mlflow_pending.append(mlflow_later)
        try:
            yield
        finally:
            if mlflow_later in _mlflow_pending:
                _mlflow_pending.remove(mlflow_later)


def _prefect_console_handlers() -> list[logging.Handler]:
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]
    handlers = {id(h): h for lg in loggers for h in getattr(lg, "handlers", []) if isinstance(h, PrefectConsoleHandler)}
    return list(handlers.values())


@contextmanager
def _prefect_console_level(level: int) -> Iterator[None]:
    """Prefect configured its logging when first imported (maybe before this command, in-process):
    the environment variable covers a later import and worker processes, this the handlers in place."""
    if os.environ.get(PREFECT_CONSOLE_LEVEL_ENV) != logging.getLevelName(level):
        yield  # the user chose Prefect's console level: theirs stands
        return
    # Prefect is not imported here (it takes seconds, which a refused command should not spend): imported
    # later in the block, it reads the variable; imported already, its handlers are set now.
    configured = "prefect" in sys.modules
    before = {handler: handler.level for handler in _prefect_console_handlers()} if configured else {}
    for handler in before:
        handler.setLevel(level)
    try:
        yield
    finally:
        for handler, old in before.items():
            handler.setLevel(old)
        if not configured and "prefect" in sys.modules:
            # Handlers Prefect made in the block took the level from the variable: theirs is NOTSET (logging.yml).
            for handler in _prefect_console_handlers():
                handler.setLevel(logging.NOTSET)


def _mlflow_event_logs_off():
    # MLflow's loggers and its eprint() ("Successfully registered model") share one switch, which
    # MLflow itself flips off and on around some imports: its counting context keeps it off until we
    # leave. MLflow's errors still reach us as exceptions.
    from mlflow.utils.autologging_utils import MlflowEventsAndWarningsBehaviorGlobally

    return MlflowEventsAndWarningsBehaviorGlobally(
        disable_event_logs=True, disable_warnings=False, reroute_warnings=False
    )
