"""Prefect's temporary API server, started by the command line itself so that its start-up overlaps the
command's own (bench/startup.py measures it).

Left to Prefect, the server starts when the flow is first called: after the preflight, the MLflow store
and the libraries have loaded one after another, and the command waits for it (about 10 s, most of it
loading Prefect's server code). Here its process starts with the command and loads that code while the
preflight runs (on the other core), serving nothing: no port is bound and no database opened until the
preflight has passed (it builds Prefect's app, and imports what serving it imports, meanwhile), and a
refusal ends it unused (`discard`).
Then it serves (`start`) while this process imports the flow; `wait` finds it ready, or nearly. It is the same
server Prefect would start (uvicorn serving Prefect's app, without the UI, on 127.0.0.1), stopped when
the command ends.

A Prefect API the user configured (`PREFECT_API_URL`, in the environment or the Prefect profile) is used as
it is: none is started, or the one prepared is stopped unused. Importing nothing of Prefect here keeps
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

from dpsynth.models.errors import StorageError
from dpsynth.tasks.environment import environment

API_URL_ENV = "PREFECT_API_URL"
STARTUP_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
SERVER_ENVIRONMENT = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
# uvicorn's exit status when the port is taken: another port is tried.
PORT_IN_USE = 3
# How often a serving server checks that the command that started it is still there.
ORPHAN_CHECK_SECONDS = 1.0


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TemporaryServer:
    """One temporary Prefect API server in a process of its own. `prepare` starts the process, which loads
    Prefect's server code and then waits, serving nothing (no port, no database); `start` has it serve
    (and returns at once), `wait` returns once it answers, `stop` ends it."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.serving = False

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def prepare(self) -> TemporaryServer:
        if importlib.util.find_spec("prefect") is None:
            raise StorageError("Prefect is not installed: reinstall dpsynth (pip install -e .).")
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__],  # `serve_when_told`, below
            stdin=subprocess.PIPE,
            # What Prefect's own temporary server is started with (no UI; its ephemeral mode).
            env={**os.environ, **SERVER_ENVIRONMENT},
        )
        self.serving = False
        return self

    def start(self) -> TemporaryServer:
        """Serve now, on a free port: the prepared process, or a new one if none is prepared any more."""
        if self.serving and self.running:
            return self
        if not self.running:
            self.prepare()
        assert self.process is not None and self.process.stdin is not None
        self.port = _free_port()
        try:
            self.process.stdin.write(f"{self.port}\n".encode())
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # it exited meanwhile: `wait` says so
        self.serving = True
        return self

    def wait(self, timeout: float | None = None) -> None:
        """Return once the server answers its health check; StorageError if it exits or does not answer
        within `timeout` (default: Prefect's own setting, 120 s under dpsynth)."""
        assert self.process is not None and self.serving, "start the server first"
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
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process = None
        self.serving = False


def configured_elsewhere() -> bool:
    """Whether the environment names a Prefect API (then none is started here)."""
    if os.environ.get(API_URL_ENV):
        return True
    if "prefect" in sys.modules:  # already loaded (tests, notebooks): its settings say it cheaply
        from prefect.settings import get_current_settings

        return bool(get_current_settings().api.url)
    return False


# The process's temporary server: later releases from the same process (the Python API in a notebook,
# tests) use it again rather than each leaving one more server running until the process exits.
_process_server: list[TemporaryServer] = []


def prepared_server() -> TemporaryServer | None:
    """Called as a command begins: a server process loading Prefect's server code while the preflight
    runs, serving nothing until `start` (`discard` it on a refusal); or the server this process already
    started, if it still runs; None where an API is configured. Stopped when the process exits, as
    Prefect's own is: Prefect's log and event workers send what they hold at exit, and their exit
    handlers, registered after this one, run before it."""
    if configured_elsewhere():
        return None
    if _process_server and _process_server[0].running:
        return _process_server[0]
    server = TemporaryServer().prepare()
    atexit.register(server.stop)
    _process_server[:] = [server]
    return server


def discard(server: TemporaryServer | None) -> None:
    """The command will run no flow (refused, or its run had already finished): a prepared server process
    ends without having served; one already serving is left to the process's later releases."""
    if server is not None and not server.serving:
        server.stop()


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


# What the app's start (its lifespan: the database's migrations, the block types' registration) and
# uvicorn's serving import only once told to serve: 500 modules, about 0.5 CPU s. Imported while the
# preflight runs instead, they leave serving its database work alone (bench/startup.py).
SERVING_MODULES = (
    "aiosqlite",
    "alembic.command",
    "alembic.config",
    "alembic.runtime.migration",
    "alembic.autogenerate",
    "prefect.server.database.alembic_commands",
    "prefect.server.models.block_registration",
    "uvicorn.loops.auto",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.lifespan.on",
)


def load_serving_code() -> None:
    """Import what serving will import, opening nothing: Prefect's installed collections (prefect-dask,
    which loads Dask), which the app's start loads to see whether its block types changed, and
    `SERVING_MODULES`."""
    import importlib

    import prefect.plugins

    prefect.plugins.load_prefect_collections()
    for module in SERVING_MODULES:
        importlib.import_module(module)


def serve_when_told() -> None:
    """The server's process (`TemporaryServer.prepare`): Prefect's server code loads, its app is built and
    what serving imports is loaded, at once; then a port on standard input has it serve there, as Prefect's
    own temporary server does (uvicorn serving its app, exit status 3 if the port is taken), while the end
    of the input (the command was refused, or ended) ends it having served nothing: no port bound, no
    database opened."""
    from dpsynth.flows.import_pause import collection_paused

    with collection_paused():
        import uvicorn
        from prefect.server.api.server import create_app

        # The app too (routes, middleware; no database, no port), served below as it is: uvicorn calling
        # Prefect's factory again would get the same app, after setting up logging and hashing every setting.
        app = create_app()
        load_serving_code()
    line = sys.stdin.readline().strip()
    if not line:
        return
    _stop_when_orphaned(os.getppid())
    uvicorn.run(app, host="127.0.0.1", port=int(line), log_level="error", lifespan="on")


def _stop_when_orphaned(parent: int) -> None:
    """A command killed by a signal runs no exit handler, so `stop` never comes: a serving server would then
    outlive it for good. A daemon thread sees the command gone (this process handed to another parent) and
    ends the server as `stop` would, by SIGTERM, which uvicorn takes as a shutdown."""
    import signal
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_CHECK_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="stop-when-orphaned", daemon=True).start()


if __name__ == "__main__":
    serve_when_told()
