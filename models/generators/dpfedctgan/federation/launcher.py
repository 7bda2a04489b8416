"""Starts a federation on this machine and stops it: the server and one client per site, each its own
process (Flower's gRPC transport on loopback, a free port unless the profile fixes one).

The launcher writes the public job and each site's rows and derived secret (`job.py`), starts the
processes together (each client waits for the server's port itself: their seconds of imports overlap),
and waits: it ends when the server has completed the last round, and fails (stopping every
process it started) when the server fails a round, when a client dies before the server is done, or at
the timeout. The server checkpoints every completed round, so a rerun resumes after the last one. With
`local_clients: false` it starts the server only: each site runs the client app on its own machine
against `server_host:server_port` (docs/generators.md).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpsynth.models.errors import DpsynthError
from dpsynth.models.generators.dpfedctgan.federation.job import FederationJob, site_folder, write_site_rows
from dpsynth.models.generators.dpfedctgan.federation.server import ERROR_FILE
from dpsynth.models.privacy.secret import SECRET_FILE, PrivacySecret

PIDS_FILE = "processes.json"
POLL_SECONDS = 0.05
STOP_GRACE_SECONDS = 2.0  # a process that ignores SIGTERM that long is killed
SERVER_MODULE = "dpsynth.models.generators.dpfedctgan.federation.server"
CLIENT_MODULE = "dpsynth.models.generators.dpfedctgan.federation.client"


class FederationFailed(DpsynthError):
    """The federation stopped before its last round (a site failed, the server failed, or the timeout
    passed); the completed rounds are checkpointed and a rerun resumes after them."""

    exit_code = 8


def site_secret(secret: PrivacySecret, site: int) -> PrivacySecret:
    """A site's own secret, derived from the run's: a site's streams never reveal another's."""
    return PrivacySecret(secret.numpy(f"dpfedctgan-site-{site}").bytes(32))


def write_site_secret(folder: Path, secret: PrivacySecret) -> None:
    path = folder / SECRET_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret._value.hex())  # noqa: SLF001 - the secret module's own file format


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Processes:
    """The processes this launcher started, and their logs."""

    folder: Path
    server: subprocess.Popen | None = None
    clients: dict[int, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        logs = self.folder / "logs"
        logs.mkdir(exist_ok=True)
        with open(logs / f"{name}.log", "ab") as log:
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
            return subprocess.Popen([sys.executable, "-m", *argv], stdout=log, stderr=subprocess.STDOUT, env=env)

    def record(self) -> None:
        pids = {
            "server": self.server.pid if self.server else None,
            **{f"site-{k}": p.pid for k, p in self.clients.items()},
        }
        (self.folder / PIDS_FILE).write_text(json.dumps(pids))

    def stop(self) -> None:
        """Terminate every process still running (then kill it), only ours, by its own handle."""
        running = [p for p in [self.server, *self.clients.values()] if p is not None and p.poll() is None]
        for p in running:
            p.terminate()
        for p in running:
            try:
                p.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def log_tail(self, name: str, lines: int = 5) -> str:
        path = self.folder / "logs" / f"{name}.log"
        text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
        return "\n".join(text[-lines:])


def run_federation(
    folder: Path,
    job: FederationJob,
    site_rows: list[np.ndarray],
    secret: PrivacySecret,
    timeout_s: float,
    on_round: Callable[[int], None] | None = None,
) -> None:
    """Run the federation to `job.last_round`; FederationFailed (every process stopped) otherwise."""
    c = job.config
    folder.mkdir(parents=True, exist_ok=True)
    job.write(folder)
    (folder / ERROR_FILE).unlink(missing_ok=True)
    if c.local_clients:
        for site, rows in enumerate(site_rows):
            write_site_secret(write_site_rows(folder, site, rows), site_secret(secret, site))
    port = c.server_port or free_port(c.server_host)
    address = f"{c.server_host}:{port}"
    procs = Processes(folder)
    try:
        procs.server = procs.start("server", [SERVER_MODULE, str(folder), address])
        if c.local_clients:
            for site in range(job.sites):
                procs.clients[site] = procs.start(f"site-{site}", [CLIENT_MODULE, str(folder), str(site), address])
        procs.record()
        _wait(procs, job, folder, time.monotonic() + timeout_s, on_round)
    finally:
        procs.stop()


def _completed(job: FederationJob) -> int:
    path = Path(job.checkpoints) / "federation.json"
    return int(json.loads(path.read_text())["round"]) if path.exists() else 0


def _wait(
    procs: Processes, job: FederationJob, folder: Path, deadline: float, on_round: Callable[[int], None] | None
) -> None:
    assert procs.server is not None
    reported = _completed(job)
    while True:
        if on_round is not None and _completed(job) > reported:
            reported = _completed(job)
            on_round(reported)
        # A dead client first: the server then fails its round too, and the client is the cause.
        for site, client in procs.clients.items():
            code = client.poll()
            if code not in (None, 0):
                raise FederationFailed(
                    f"Site {site}'s client stopped with exit status {code} during round {_completed(job) + 1} of "
                    f"{job.last_round}; the round is not averaged without it. Rounds up to {_completed(job)} are "
                    f"checkpointed: rerun the release to resume. Its log ends: {procs.log_tail(f'site-{site}', 3)}"
                )
        code = procs.server.poll()
        if code == 0:
            return
        if code is not None:
            reason = (folder / ERROR_FILE).read_text().strip() if (folder / ERROR_FILE).exists() else ""
            raise FederationFailed(
                f"The federation's server stopped with exit status {code} after round {_completed(job)} of "
                f"{job.last_round}: {reason or procs.log_tail('server')}. The completed rounds are checkpointed: "
                "rerun the release to resume."
            )
        if time.monotonic() > deadline:
            raise FederationFailed(
                f"The federation did not finish within its timeout (round {_completed(job)} of {job.last_round}); "
                "rerun the release to resume after the last completed round."
            )
        time.sleep(POLL_SECONDS)


__all__ = ["FederationFailed", "run_federation", "site_folder"]
