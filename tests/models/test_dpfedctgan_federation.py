"""DP-Fed-CTGAN's federation processes, without a release: on this machine the SuperLink admits only the
SuperNodes whose keys the launcher registered (federation/trust.py), only the launcher's app runs in the
app processes the SuperLink and the SuperNodes start, and only in the launcher's run (federation/guard.py:
the Control API has no client authentication, so anyone who reaches it can submit a run); the launcher's
stop leaves no process of the groups it started. Real Flower processes (a SuperLink, a SuperNode, `flwr`):
seconds each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from flwr.app import Context, Message, RecordDict

from dpsynth.models.generators.dpfedctgan.config import DPFedCTGANConfig
from dpsynth.models.generators.dpfedctgan.federation import client, launcher
from dpsynth.models.generators.dpfedctgan.federation.guard import (
    FOLDER_ENV,
    GUARD_DIR,
    RunRefused,
    app_commands,
    write_guards,
    write_run_id,
)
from dpsynth.models.generators.dpfedctgan.federation.launcher import (
    Ports,
    copy_app,
    flower_env,
    start_sites,
    superlink_argv,
    supernode_argv,
    toml_string,
    wait_for_control,
    write_flower_home,
)
from dpsynth.models.generators.dpfedctgan.federation.processes import Processes
from dpsynth.models.generators.dpfedctgan.federation.trust import LoopbackTLS, write_loopback_tls, write_site_keys

pytestmark = pytest.mark.slow

RUN_WAIT_S = 60.0


@dataclass
class Federation:
    procs: Processes
    ports: Ports
    tls: LoopbackTLS
    c: DPFedCTGANConfig = field(default_factory=DPFedCTGANConfig)

    @classmethod
    def prepare(cls, folder: Path) -> Federation:
        """What the launcher sets up before its first process: ports, TLS, Flower's home, the app copied
        and its wrappers (the app's FAB hash), and the environment they make."""
        c = DPFedCTGANConfig()
        ports = Ports.choose(c)
        tls = write_loopback_tls(folder / "tls", c.server_host)
        _, fab_hash = copy_app(folder)
        env = flower_env(write_flower_home(folder, ports, tls), write_guards(folder, fab_hash), folder)
        return cls(Processes(folder, env), ports, tls, c)

    def start_superlink(self) -> None:
        self.procs.start("superlink", superlink_argv(self.c.server_host, self.ports, self.tls))
        wait_for_control(self.procs, self.ports, time.monotonic() + 60)

    @property
    def fleet(self) -> str:
        return f"{self.c.server_host}:{self.ports.fleet}"


def flwr(procs: Processes, *args: str) -> dict:
    done = subprocess.run(
        ["flwr", *args, "--format", "json"], env=procs.env, cwd=procs.folder, capture_output=True, text=True
    )
    return json.loads(done.stdout)


def submit(procs: Processes, app: Path, *config: str) -> int:
    answer = flwr(procs, "run", str(app), "local", *[arg for pair in config for arg in ("--run-config", pair)])
    assert answer["success"], answer
    return int(answer["run-id"])


def finished(procs: Processes, run_id: int) -> dict:
    """The run's entry in `flwr ls` once it has finished."""
    deadline = time.monotonic() + RUN_WAIT_S
    while time.monotonic() < deadline:
        (run,) = flwr(procs, "ls", "local", "--run-id", str(run_id))["runs"]
        if run["status"].startswith("finished"):
            return run
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not finish within {RUN_WAIT_S:g} s: {run}")


def write_foreign_app(root: Path, markers: Path) -> Path:
    """Someone else's Flower app: its ServerApp and ClientApp each leave a marker file when they run, and
    the ServerApp asks every SuperNode once, recording the replies."""
    app = root / "foreign-app"
    (app / "foreignapp").mkdir(parents=True)
    (app / "pyproject.toml").write_text(
        textwrap.dedent("""
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "foreignapp"
            version = "1.0.0"
            dependencies = []

            [tool.flwr.app]
            publisher = "someone-else"

            [tool.flwr.app.components]
            serverapp = "foreignapp.apps:server"
            clientapp = "foreignapp.apps:client"
        """)
    )
    (app / "foreignapp" / "__init__.py").write_text("")
    (app / "foreignapp" / "apps.py").write_text(
        textwrap.dedent(f"""
            import time
            from pathlib import Path

            from flwr.app import Context, Message, MetricRecord, RecordDict
            from flwr.clientapp import ClientApp
            from flwr.serverapp import Grid, ServerApp

            MARKERS = Path({str(markers)!r})
            server = ServerApp()
            client = ClientApp()

            @server.main()
            def main(grid: Grid, context: Context) -> None:
                (MARKERS / "serverapp").write_text("ran")
                deadline = time.monotonic() + 30
                while not list(grid.get_node_ids()) and time.monotonic() < deadline:
                    time.sleep(0.1)
                asks = [Message(RecordDict(), dst_node_id=n, message_type="query") for n in grid.get_node_ids()]
                replies = list(grid.send_and_receive(asks, timeout=30))
                errors = [r.error.reason for r in replies if r.has_error()]
                (MARKERS / "replies").write_text(f"{{len(replies)}} replies; errors: {{errors}}")

            @client.query()
            def query(message: Message, context: Context) -> Message:
                (MARKERS / "clientapp").write_text("ran")
                return Message(RecordDict({{"m": MetricRecord({{"x": 1}})}}), reply_to=message)
        """)
    )
    return app


def installed(procs: Processes) -> list[str]:
    return [p.name for p in (procs.folder / "flwr-home").rglob("*")]


def test_a_port_another_process_took_is_not_mistaken_for_the_superlinks_and_the_start_moves_on(tmp_path, monkeypatch):
    """Another process listens on the Control port chosen for the SuperLink (free when chosen; another
    federation took it): the SuperLink exits, its port being in use; the launcher does not take the other
    process's port for the SuperLink's, starts it again on other ports, and its sites register and join."""
    with socket.socket() as other:
        other.bind((launcher.LOOPBACK, 0))
        other.listen()
        taken = other.getsockname()[1]
        real_choose = Ports.choose.__func__
        chosen: list[Ports] = []

        def choose(cls, c):
            ports = real_choose(cls, c)
            ports = Ports(ports.fleet, taken, ports.serverappio) if not chosen else ports
            chosen.append(ports)
            return ports

        monkeypatch.setattr(Ports, "choose", classmethod(choose))
        c = DPFedCTGANConfig()
        tls = write_loopback_tls(tmp_path / "tls", c.server_host)
        _, fab_hash = copy_app(tmp_path)
        guards = write_guards(tmp_path, fab_hash)
        for site in range(2):  # as the launcher leaves them: each site's folder holds its rows
            (tmp_path / f"site-{site}").mkdir(mode=0o700)
        procs = launcher.start_superlink_and_sites(tmp_path, c, tls, guards, 2, time.monotonic() + 120, fab_hash)
        try:
            assert len(chosen) == 2 and chosen[1].control != taken
            assert launcher.listens_on(procs.started["superlink"].pid, chosen[1].control)
            assert not launcher.listens_on(procs.started["superlink"].pid, taken)
            assert launcher.listens_on(os.getpid(), taken)  # the port is this process's: told apart
            assert sorted(procs.started) == ["clientapps", "site-0", "site-1", "superlink"]
            assert "already in use" in (tmp_path / "logs" / "superlink.log").read_text(errors="replace")
        finally:
            procs.stop()
    for proc in procs.started.values():
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)


def test_a_supernode_binds_its_clientappio_port_itself(tmp_path):
    """A port chosen free here and bound later by the SuperNode can be taken in between (by another site's
    SuperNode or any process); port 0 leaves the choice to the bind."""
    fed = Federation.prepare(tmp_path)
    argv = supernode_argv(fed.fleet, tmp_path, 0, tmp_path / "key", fed.tls)
    assert argv[argv.index("--clientappio-api-address") + 1] == "127.0.0.1:0"


def test_a_supernode_with_an_unregistered_key_cannot_join_and_stop_leaves_no_process(tmp_path):
    fed = Federation.prepare(tmp_path)
    procs = fed.procs
    try:
        fed.start_superlink()
        (tmp_path / "site-0").mkdir(mode=0o700)
        key = write_site_keys(tmp_path / "site-0")  # a key pair the SuperLink was never told of
        assert oct((key.stat().st_mode) & 0o777) == "0o600"
        argv = supernode_argv(fed.fleet, tmp_path, 0, key, fed.tls)
        stranger = procs.start("stranger", [*argv, "--max-retries", "1"])
        deadline = time.monotonic() + 60
        while stranger.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        log = (tmp_path / "logs" / "stranger.log").read_text(errors="replace")
        assert stranger.poll() not in (None, 0), log
        assert "No SuperNode found with the given public key" in log and "SuperNode ID" not in log
    finally:
        procs.stop()
    for proc in procs.started.values():
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)


def test_the_superlink_runs_neither_a_foreign_app_nor_our_app_in_a_foreign_run(tmp_path):
    """Another local user reaches the Control API: their own app's ServerApp is refused before any of its
    files is installed, and our app submitted with their run config is refused by our ServerApp before it
    reads the job or writes a file; every other app command refuses outright."""
    markers = tmp_path / "markers"
    markers.mkdir()
    foreign = write_foreign_app(tmp_path, markers)
    fed = Federation.prepare(tmp_path)
    procs = fed.procs
    guards = tmp_path / GUARD_DIR
    assert oct(guards.stat().st_mode & 0o777) == "0o700"
    assert sorted(p.name for p in guards.iterdir()) == app_commands()
    assert all(p.stat().st_mode & 0o777 == 0o700 for p in guards.iterdir())
    refused = subprocess.run([guards / "flwr-simulation", "--insecure"], env=procs.env, capture_output=True, text=True)
    assert refused.returncode != 0 and "refused" in refused.stderr
    write_run_id(tmp_path, 1)  # the launcher's run (no run of a SuperLink has id 1 in practice)
    ours = tmp_path / "flower-app"
    elsewhere = tmp_path / "elsewhere"  # a run config naming a folder of the foreign user's
    try:
        fed.start_superlink()
        runs = [
            submit(procs, foreign),
            submit(procs, ours, f"folder={toml_string(str(tmp_path))}"),
            submit(procs, ours, f"folder={toml_string(str(elsewhere))}"),
        ]
        theirs, ours_here, ours_elsewhere = (finished(procs, run_id) for run_id in runs)
        assert all(run["status"] == "finished:failed" for run in (theirs, ours_here, ours_elsewhere))
        assert "refused a Flower app bundle that is not this federation's" in theirs["status-details"], theirs
        assert not any("foreignapp" in name for name in installed(procs))
        assert f"refused run {runs[1]}: this federation's run is 1" in ours_here["status-details"], ours_here
        assert "is not this federation's" in ours_elsewhere["status-details"], ours_elsewhere
    finally:
        procs.stop()
    assert list(markers.iterdir()) == []
    assert not (tmp_path / "server_app.pid").exists() and not (tmp_path / "logs" / "server.log").exists()


def test_a_supernode_runs_no_foreign_clientapp(tmp_path):
    """Were a foreign ServerApp to run (here: a SuperLink started without the wrappers), the launcher's
    SuperNode still refuses its ClientApp before any of it is installed: the ServerApp's request fails."""
    markers = tmp_path / "markers"
    markers.mkdir()
    foreign = write_foreign_app(tmp_path, markers)
    fed = Federation.prepare(tmp_path)
    procs = fed.procs
    guarded = procs.env
    procs.env = {**guarded, "PATH": guarded["PATH"].split(os.pathsep, 1)[1]}  # the SuperLink unguarded
    try:
        fed.start_superlink()
        procs.env = guarded
        (tmp_path / "site-0").mkdir(mode=0o700)
        start_sites(procs, tmp_path, fed.fleet, 1, fed.tls)
        run = finished(procs, submit(procs, foreign))
        assert (markers / "serverapp").exists(), run  # the unguarded SuperLink did run it
        replies = (markers / "replies").read_text()
        assert replies.startswith("1 replies") and "refused a Flower app bundle" in replies, replies
    finally:
        procs.stop()
    assert not (markers / "clientapp").exists()


def test_our_clientapp_refuses_another_run_before_reading_the_rows(tmp_path, monkeypatch):
    """The ClientApp under the launcher checks the run first: another run's request fails with the
    refusal, not with the missing rows it would otherwise have tried to read."""
    monkeypatch.setenv(FOLDER_ENV, str(tmp_path))
    write_run_id(tmp_path, 7)
    context = Context(
        run_id=8, node_id=1, node_config={"site": 0, "folder": str(tmp_path)}, state=RecordDict(), run_config={}
    )
    message = Message(RecordDict(), dst_node_id=1, message_type="query")
    with pytest.raises(RunRefused, match="refused run 8: this federation's run is 7"):
        client.counts(message, context)
    with pytest.raises(RunRefused, match="is not this federation's"):
        client.counts(message, Context(8, 1, {"site": 0, "folder": str(tmp_path / "x")}, RecordDict(), {}))


def _wrapper_run(bin_dir: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    wrapper = [str(bin_dir / "flwr-clientapp"), *args]
    return subprocess.run(wrapper, env=env, cwd=bin_dir.parent, capture_output=True, text=True, timeout=120)


def test_a_local_sites_clientapps_are_forked_from_the_warm_process_with_the_wrappers_streams_and_status(tmp_path):
    """The `flwr-clientapp` wrapper of a local federation hands its arguments and standard streams to the warm
    process (warm_clientapp.py), which forks the guarded ClientApp (guard.py, Flower's own entry point) and relays
    its exit status; with no warm process listening, the wrapper runs the guard itself, as the plain wrapper does."""
    from dpsynth.models.generators.dpfedctgan.federation import warm_clientapp

    fab_hash = "0" * 64
    bin_dir = write_guards(tmp_path, fab_hash)
    wrapper = warm_clientapp.write_wrapper(bin_dir, fab_hash)
    assert wrapper.stat().st_mode & 0o777 == 0o700 and " -S " in wrapper.read_text()  # no site-packages: quick
    env = {**os.environ, FOLDER_ENV: str(tmp_path), "FLWR_HOME": str(tmp_path / "flwr-home")}

    # No warm process yet: the guard, in a process of its own (Flower's own help and usage errors).
    alone = _wrapper_run(bin_dir, env, "--help")
    assert alone.returncode == 0 and "Run a Flower ClientApp" in alone.stdout, alone.stderr

    procs = Processes(tmp_path, env)
    procs.start("clientapps", warm_clientapp.serve_argv(bin_dir, fab_hash))
    try:
        deadline = time.monotonic() + 120
        while not (bin_dir / warm_clientapp.SOCKET_NAME).exists():
            assert procs.started["clientapps"].poll() is None, procs.log_tail("clientapps", 20)
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert (bin_dir / warm_clientapp.SOCKET_NAME).stat().st_mode & 0o777 == 0o600
        with socket.socket(socket.AF_UNIX) as stranger:  # not a request (no streams): dropped, nothing forked
            warm_clientapp._at(str(bin_dir / warm_clientapp.SOCKET_NAME), stranger.connect)  # a path over 107 bytes
            stranger.sendall(b"not a request")
            assert stranger.recv(64) == b""
        helped = _wrapper_run(bin_dir, env, "--help")
        refused = _wrapper_run(bin_dir, env, "--no-such-option")
        log = (tmp_path / "logs" / "clientapps.log").read_text()
    finally:
        procs.stop()
    assert helped.returncode == 0 and "Run a Flower ClientApp" in helped.stdout, helped.stderr
    assert refused.returncode == 2 and "error: one of the arguments --token" in refused.stderr  # on its stderr
    assert log.count("forked") == 2  # both came from the warm process


FORKED_DRAWS = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np, torch
    from dpsynth.models.generators.dpfedctgan.federation import guard, warm_clientapp
    out = sys.argv[1]

    def draws(command, expected, args):  # stands in for the guarded ClientApp, in the forked child
        with open(os.path.join(out, str(os.getpid())), "w") as f:
            json.dump([float(np.random.random()), float(torch.rand(1))], f)
        return 0

    guard.run_guarded = draws
    streams = [os.open(os.devnull, os.O_RDWR) for _ in range(warm_clientapp.STREAMS)]
    for _ in range(2):
        pid = os.fork()
        if pid == 0:  # what the warm process does for each request
            warm_clientapp._run_child([], {"cwd": out, "env": dict(os.environ), "args": []}, list(streams), "0")
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    """
)


def test_forked_clientapps_draw_their_global_random_states_afresh_as_new_processes_do(tmp_path):
    """Two ClientApps forked from one warm process do not share NumPy's or torch's global random state (each new
    process seeds them from the OS): warm_clientapp's child reseeds both before the guarded ClientApp runs. The
    forks happen in a process of their own, single-threaded as the warm process is (not in pytest's)."""
    done = subprocess.run(
        [sys.executable, "-c", FORKED_DRAWS, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = (json.loads(p.read_text()) for p in tmp_path.iterdir())
    assert first[0] != second[0] and first[1] != second[1]
