"""The command's temporary Prefect server (dpsynth.flows.prefect_server) ends with the command even when the
command is killed by a signal, which runs no exit handler: a release stopped by SIGKILL or SIGTERM must not leave
a server serving, holding memory and a port, for good."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import psutil

# A command that starts the server, says its process id once it answers, and then waits to be killed.
COMMAND = textwrap.dedent(
    """
    import sys
    from dpsynth.flows.prefect_server import TemporaryServer
    server = TemporaryServer().prepare().start()
    server.wait()
    print(server.process.pid, flush=True)
    sys.stdin.readline()
    """
)


def test_a_serving_server_ends_when_the_command_that_started_it_is_killed(tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    command = subprocess.Popen(
        [sys.executable, "-c", COMMAND], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        server = psutil.Process(int(command.stdout.readline()))
        assert server.is_running() and server.ppid() == command.pid
    finally:
        command.kill()  # SIGKILL: no exit handler runs, so the command's own `stop` never comes
        command.wait()
    # Before: the server kept serving under init. Now it sees its command gone within a second and shuts down.
    server.wait(timeout=30)
