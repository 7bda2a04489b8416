"""Prefect's temporary API server, started by the command line itself so that its start-up overlaps the
command's own (bench/startup.py measures it).

Left to Prefect, the server starts when the flow is first called: after the preflight, the MLflow store
and the libraries have loaded one after another, and the command waits for it (about 10 s). Here it starts
once the preflight has passed (a refusal never waits for a server) and loads in its own process while this
one opens the MLflow store and imports the flow; `wait` then finds it ready, or nearly. It is the same
server Prefect would start (its `SubprocessASGIServer` command: uvicorn serving Prefect's app, without the
UI, on 127.0.0.1), stopped when the command ends.

A Prefect API the user configured (`PREFECT_API_URL`, in the environment or the Prefect profile) is used as
it is: none is started, or the one started is stopped unused. Importing nothing of Prefect here keeps
the start immediate; whether a profile names an API is known only once Prefect is imported (`use`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from dpsynth.models.errors import StorageError
from dpsynth.tasks.environment import environment

API_URL_ENV = "PREFECT_API_URL"
STARTUP_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
SERVER_ENVIRONMENT = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
# uvicorn's exit status when the port is taken: another port is tried.
PORT_IN_USE = 3


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TemporaryServer:
    """One temporary Prefect API server in a process of its own: `start` returns at once, `wait` until it
    answers, `stop` ends it."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> TemporaryServer:
        spec = importlib.util.find_spec("prefect")
        if spec is None or spec.origin is None:
            raise StorageError("Prefect is not installed: reinstall dpsynth (pip install -e .).")
        self.port = _free_port()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--app-dir",
                str(Path(spec.origin).parent.parent),
                "--factory",
                "prefect.server.api.server:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "error",
                "--lifespan",
                "on",
            ],
            # What Prefect's own temporary server is started with (no UI; its ephemeral mode).
            env={**os.environ, **SERVER_ENVIRONMENT},
        )
        return self

    def wait(self, timeout: float | None = None) -> None:
        """Return once the server answers its health check; StorageError if it exits or does not answer
        within `timeout` (default: Prefect's own setting, 120 s under dpsynth)."""
        assert self.process is not None, "start the server first"
        limit = timeout if timeout is not None else float(os.environ.get(STARTUP_TIMEOUT_ENV, "120"))
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code == PORT_IN_USE:
                self.start()  # the port was taken between choosing and binding it: another one
                continue
            if code is not None:
                raise StorageError(
                    f"Prefect's temporary API server exited (status {code}) before answering. Nothing was "
                    "trained or published; rerun, or point PREFECT_API_URL at a running Prefect server."
                )
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        raise StorageError(
            f"Prefect's temporary API server did not answer within {limit:g} s (set {STARTUP_TIMEOUT_ENV} to "
            "wait longer, or point PREFECT_API_URL at a running Prefect server). Nothing was trained or published."
        )

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


def configured_elsewhere() -> bool:
    """Whether the environment names a Prefect API (then none is started here)."""
    if os.environ.get(API_URL_ENV):
        return True
    if "prefect" in sys.modules:  # already loaded (tests, notebooks): its settings say it cheaply
        from prefect.settings import get_current_settings

        return bool(get_current_settings().api.url)
    return False


def early_server() -> TemporaryServer | None:
    """A temporary server started now (None where an API is configured), stopped when the process exits,
    as Prefect's own is: Prefect's log and event workers send what they hold at exit, and their exit
    handlers, registered after this one, run before it."""
    if configured_elsewhere():
        return None
    server = TemporaryServer().start()
    atexit.register(server.stop)
    return server


@contextlib.contextmanager
def use(server: TemporaryServer | None) -> Iterator[None]:
    """Flows called in the block talk to `server` (waited for here), unless Prefect's settings name an API
    of the user's (then that one) or turn temporary servers off: then `server` is stopped unused. Worker
    processes inherit the address."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    settings = get_current_settings()
    # A configured API, or temporary servers turned off: Prefect's own settings decide, as without dpsynth.
    if server is None or settings.api.url or not settings.server.ephemeral.enabled:
        if server is not None:
            server.stop()
        yield
        return
    server.wait()
    with environment({API_URL_ENV: server.api_url}), temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        yield
