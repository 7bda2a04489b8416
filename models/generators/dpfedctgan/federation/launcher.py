"""Starts a federation on Flower's deployment engine on this machine and stops it: a SuperLink and one
SuperNode per site, each its own process group (processes.py), on loopback; free ports unless the profile
fixes them.

The launcher writes the public job and each site's rows and derived secret (`job.py`), gives Flower a home
of its own in the run's folder (`flwr-home/`: its config, the installed app; nothing under ~/.flwr), starts
the SuperLink (`--isolation subprocess`: it starts the ServerApp's process itself) and the SuperNodes
(each with `--node-config 'site=K folder="FOLDER"'`: the ClientApp it runs reads that site's files only;
each authenticated by a key pair drawn for the run, trust.py), then submits the app (`flower_app/`,
the job folder as run config) with `flwr run` on the SuperLink's loopback Control API and records the
run's id (`run_id`). Every Flower process it starts finds, first on its PATH, wrappers that run only
that app's FAB, and the apps serve that run only (guard.py: the Control API has no client
authentication). No process installs anything at run time. It waits: it ends when the ServerApp
has completed the last round, and fails (stopping every process group it started) when the ServerApp
fails a round, when a SuperNode or the SuperLink dies before the ServerApp is done, or at the timeout.
The ServerApp checkpoints every completed round, so a rerun resumes after the last one. With
`local_clients: false` it starts the SuperLink only: each site runs a SuperNode on its own machine
against `server_host:server_port` (docs/generators.md).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpsynth.models.errors import DpsynthError
from dpsynth.models.generators.dpfedctgan.config import DPFedCTGANConfig
from dpsynth.models.generators.dpfedctgan.federation.guard import (
    FOLDER_ENV,
    RUN_ID_FILE,
    fab_sha256,
    write_guards,
    write_run_id,
)
from dpsynth.models.generators.dpfedctgan.federation.job import (
    DONE_FILE,
    ERROR_FILE,
    PID_FILE,
    FederationJob,
    site_folder,
    telemetry_off,
    write_site_rows,
)
from dpsynth.models.generators.dpfedctgan.federation.processes import Processes
from dpsynth.models.generators.dpfedctgan.federation.supernode import write_superexec
from dpsynth.models.generators.dpfedctgan.federation.trust import (
    LoopbackTLS,
    register_keys,
    write_loopback_tls,
    write_site_keys,
)
from dpsynth.models.generators.dpfedctgan.federation.warm_clientapp import serve_argv
from dpsynth.models.generators.dpfedctgan.federation.warm_clientapp import write_wrapper as write_warm_wrapper
from dpsynth.models.privacy.secret import SECRET_FILE, PrivacySecret

POLL_SECONDS = 0.05
LOOPBACK = "127.0.0.1"
SUBMIT_TIMEOUT_S = 120.0
APP_DIR = Path(__file__).parent / "flower_app"  # the Flower app `flwr run` submits (package data)


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


# Starts of the SuperLink on fresh ports after a port was taken between its choice and the SuperLink's bind.
START_ATTEMPTS = 3
# How long a SuperLink whose start failed is given to end on its own (a lost port ends it within a second).
STOP_WAIT_SECONDS = 5.0


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def toml_string(value: str) -> str:
    """`value` as a TOML string inside Flower's `key="value"` lists (which end a value at its quote)."""
    if any(ch in value for ch in "\"'\\\n"):
        raise FederationFailed(
            f"The federation's folder {value!r} holds a quote or a backslash: Flower's configs cannot carry it."
        )
    return f'"{value}"'


@dataclass(frozen=True)
class Ports:
    fleet: int  # on server_host: where the SuperNodes connect
    control: int  # loopback: where `flwr run` submits the app
    serverappio: int  # loopback: where the ServerApp's process talks to the SuperLink

    @classmethod
    def choose(cls, c: DPFedCTGANConfig) -> Ports:
        """The profile's Fleet port (or a free one), and two free loopback ports that differ from it."""
        fleet = c.server_port or free_port(c.server_host)
        control = serverappio = fleet
        while control == fleet:
            control = free_port(LOOPBACK)
        while serverappio in (fleet, control):
            serverappio = free_port(LOOPBACK)
        return cls(fleet, control, serverappio)


def flower_env(home: Path, guards: Path, folder: Path) -> dict[str, str]:
    """The environment of every Flower process: telemetry off, Flower's home in the run's folder, the job
    folder the apps trust (`FOLDER_ENV`), and on PATH first the app wrappers (`guards`, guard.py, and the
    SuperExec with shorter polls, supernode.py), then this interpreter's scripts (the SuperLink and SuperNodes
    start `flower-superexec`, `flwr-serverapp` and `flwr-clientapp` by name)."""
    scripts = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        FOLDER_ENV: str(folder),
        "PATH": os.pathsep.join([str(guards), scripts, os.environ.get("PATH", "")]),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    return telemetry_off(env)


def write_flower_home(folder: Path, ports: Ports, tls: LoopbackTLS | None) -> Path:
    """`flwr-home/` (owner-only): `flwr`'s connection to this run's SuperLink, named `local` (over TLS,
    trusting the run's CA only, when the launcher drew one)."""
    home = folder / "flwr-home"
    home.mkdir(mode=0o700, exist_ok=True)
    trust = f"root-certificates = {toml_string(str(tls.ca))}" if tls else "insecure = true"
    connection = f'[superlink.local]\naddress = "{LOOPBACK}:{ports.control}"\n{trust}\n'
    (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n{connection}')
    return home


def superlink_argv(host: str, ports: Ports, tls: LoopbackTLS | None) -> list[str]:
    """With `tls`: TLS on the Fleet and Control APIs and SuperNode authentication; without: neither."""
    secure = ["--insecure"]
    if tls is not None:
        secure = ["--ssl-certfile", str(tls.cert), "--ssl-keyfile", str(tls.key), "--ssl-ca-certfile", str(tls.ca)]
        secure.append("--enable-supernode-auth")
    return [
        "flower-superlink",
        *secure,
        "--isolation", "subprocess",
        "--disable-runtime-dependency-installation",
        "--fleet-api-address", f"{host}:{ports.fleet}",
        "--control-api-address", f"{LOOPBACK}:{ports.control}",
        "--serverappio-api-address", f"{LOOPBACK}:{ports.serverappio}",
    ]  # fmt: skip


def supernode_argv(superlink: str, folder: Path, site: int, key: Path, tls: LoopbackTLS) -> list[str]:
    """Port 0 for the ClientAppIo API: the SuperNode binds a port the OS picks and hands the bound address to
    the SuperExec it starts, so no port chosen free here can be taken by another process before the bind.
    Flower's own SuperNode, with shorter waits between its pulls (supernode.py)."""
    return [
        sys.executable, "-P", "-m", "dpsynth.models.generators.dpfedctgan.federation.supernode",
        "--root-certificates", str(tls.ca),
        "--auth-supernode-private-key", str(key),
        "--superlink", superlink,
        "--clientappio-api-address", f"{LOOPBACK}:0",
        "--node-config", f"site={site} folder={toml_string(str(folder))}",
    ]  # fmt: skip


def listens_on(pid: int, port: int) -> bool:
    """Whether the process `pid` (or a child of it) listens on TCP `port`: a port open on loopback may be
    another process's, chosen free by it at the same moment as by this launcher."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    for proc in family:
        try:
            sockets = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port for s in sockets):
            return True
    return False


def wait_for_control(procs: Processes, ports: Ports, deadline: float) -> None:
    """Wait until the SuperLink itself listens on its Control API; FederationFailed if it ends first."""
    superlink = procs.started["superlink"]
    while not (port_open(LOOPBACK, ports.control) and listens_on(superlink.pid, ports.control)):
        if superlink.poll() is not None or time.monotonic() > deadline:
            raise FederationFailed(
                f"The federation's SuperLink did not start (exit status {superlink.poll()}); its log ends: "
                f"{procs.log_tail('superlink')}"
            )
        time.sleep(POLL_SECONDS)


def start_sites(procs: Processes, folder: Path, superlink: str, sites: int, tls: LoopbackTLS) -> None:
    """A key pair per site, registered with the SuperLink (trust.py), then each site's SuperNode."""
    site_dirs = [site_folder(folder, site) for site in range(sites)]
    keys = [write_site_keys(d) for d in site_dirs]
    failed = register_keys(site_dirs, procs.env, folder)
    if failed:
        raise FederationFailed(f"The sites' keys could not be registered with the SuperLink: {failed}")
    for site, key in enumerate(keys):
        procs.start(f"site-{site}", supernode_argv(superlink, folder, site, key, tls))


def copy_app(folder: Path) -> tuple[Path, str]:
    """The app copied into the run's folder (`flower-app/`), and the SHA-256 of the FAB `flwr run` builds
    from it: the only FAB the app wrappers let run (guard.py)."""
    app = folder / "flower-app"
    shutil.rmtree(app, ignore_errors=True)
    shutil.copytree(APP_DIR, app)
    return app, fab_sha256(app)


def submit_run(procs: Processes, folder: Path, app: Path) -> int:
    """Submit `app` with `flwr run` to the SuperLink named `local`, the job folder as run config; the
    run's id, recorded at once in `folder/run_id` (the one run the apps serve, guard.py)."""
    argv = ["flwr", "run", str(app), "local", "--format", "json", "--run-config", f"folder={toml_string(str(folder))}"]
    done = subprocess.run(
        argv, env=procs.env, cwd=folder, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S, check=False
    )
    (folder / "logs").mkdir(exist_ok=True)
    (folder / "logs" / "flwr-run.log").write_text(done.stdout + done.stderr)
    try:
        answer = json.loads(done.stdout)
        run_id = int(answer["run-id"]) if done.returncode == 0 and answer.get("success") else None
    except (ValueError, TypeError, KeyError):
        run_id = None
    if run_id is None:
        output = (done.stdout + done.stderr).strip()
        raise FederationFailed(f"`flwr run` could not submit the federation's app: {output}")
    write_run_id(folder, run_id)
    return run_id


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
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    job.write(folder)
    for name in (ERROR_FILE, DONE_FILE, PID_FILE, RUN_ID_FILE):
        (folder / name).unlink(missing_ok=True)
    if c.local_clients:
        for site, rows in enumerate(site_rows):
            write_site_secret(write_site_rows(folder, site, rows), site_secret(secret, site))
    tls = write_loopback_tls(folder / "tls", c.server_host) if c.local_clients else None
    app, fab_hash = copy_app(folder)
    guards = write_guards(folder, fab_hash)
    write_superexec(guards)  # the SuperExecs' polls shortened too (supernode.py)
    if c.local_clients:
        write_warm_wrapper(guards, fab_hash)  # each ClientApp forked from a warm process (warm_clientapp.py)
    deadline = time.monotonic() + timeout_s
    procs = start_superlink_and_sites(folder, c, tls, guards, job.sites, deadline, fab_hash)
    try:
        submit_run(procs, folder, app)
        _wait(procs, job, folder, deadline, on_round)
    finally:
        procs.stop()


def start_superlink_and_sites(
    folder: Path,
    c: DPFedCTGANConfig,
    tls: LoopbackTLS | None,
    guards: Path,
    sites: int,
    deadline: float,
    fab_hash: str,
) -> Processes:
    """The SuperLink on free ports and, for local clients, the warm process their ClientApps fork from
    (warm_clientapp.py: it imports while the SuperLink starts) and each site's SuperNode. A port is free when it is
    chosen, not reserved: another process (another federation on the machine) can bind it first, and the
    SuperLink then exits. The start is then tried again on other ports, at most `START_ATTEMPTS` times;
    any other failure stops what was started and is raised."""
    for attempt in range(1, START_ATTEMPTS + 1):
        ports = Ports.choose(c)
        procs = Processes(folder, flower_env(write_flower_home(folder, ports, tls), guards, folder))
        try:
            procs.start("superlink", superlink_argv(c.server_host, ports, tls))
            if tls is not None:
                procs.start("clientapps", serve_argv(guards, fab_hash))
            wait_for_control(procs, ports, deadline)
            if tls is not None:
                start_sites(procs, folder, f"{c.server_host}:{ports.fleet}", sites, tls)
            return procs
        except BaseException as error:
            taken = isinstance(error, FederationFailed) and _lost_a_port(procs)
            procs.stop()
            if not taken or attempt == START_ATTEMPTS:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _lost_a_port(procs: Processes) -> bool:
    """Whether the SuperLink ended because a port it was given was taken meanwhile (Flower's log says so)."""
    superlink = procs.started["superlink"]
    try:
        superlink.wait(timeout=STOP_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        return False
    return "already in use" in procs.log_tail("superlink")


def _completed(job: FederationJob) -> int:
    path = Path(job.checkpoints) / "federation.json"
    return int(json.loads(path.read_text())["round"]) if path.exists() else 0


def _server_app_gone(folder: Path) -> bool:
    """Whether the ServerApp's process started and has ended (without its done or error file)."""
    path = folder / PID_FILE
    if not path.exists():
        return False
    try:
        os.kill(int(path.read_text()), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False


def _wait(
    procs: Processes, job: FederationJob, folder: Path, deadline: float, on_round: Callable[[int], None] | None
) -> None:
    reported = _completed(job)
    while True:
        if on_round is not None and _completed(job) > reported:
            reported = _completed(job)
            on_round(reported)
        if (folder / DONE_FILE).exists():
            return
        # A dead SuperNode first: the ServerApp then fails its round too, and the site is the cause.
        for name, proc in procs.started.items():
            code = proc.poll()
            if name.startswith("site-") and code is not None:
                site = name.removeprefix("site-")
                raise FederationFailed(
                    f"Site {site}'s client stopped with exit status {code} during round {_completed(job) + 1} of "
                    f"{job.last_round}: its SuperNode ended, and the round is not averaged without it. Rounds up to "
                    f"{_completed(job)} are checkpointed: rerun the release to resume. Its log ends: "
                    f"{procs.log_tail(name, 3)}"
                )
        if (folder / ERROR_FILE).exists() or _server_app_gone(folder) or procs.started["superlink"].poll() is not None:
            time.sleep(POLL_SECONDS)  # the error file is written before the process ends
            reason = (folder / ERROR_FILE).read_text().strip() if (folder / ERROR_FILE).exists() else ""
            if not reason and (folder / DONE_FILE).exists():
                return
            raise FederationFailed(
                f"The federation's server stopped after round {_completed(job)} of {job.last_round}: "
                f"{reason or procs.log_tail('superlink')}. The completed rounds are checkpointed: rerun the "
                "release to resume."
            )
        if time.monotonic() > deadline:
            raise FederationFailed(
                f"The federation did not finish within its timeout (round {_completed(job)} of {job.last_round}); "
                "rerun the release to resume after the last completed round."
            )
        time.sleep(POLL_SECONDS)


__all__ = ["FederationFailed", "run_federation", "site_folder"]
