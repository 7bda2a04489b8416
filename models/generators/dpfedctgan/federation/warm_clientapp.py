"""Each ClientApp forked from one warm process, instead of a new Python that imports Flower and torch first.

Flower's SuperExec starts a new `flwr-clientapp` process for every message a site receives (the counts query and
every round), and each one spent about 3-4 CPU seconds importing Flower, torch and torch._dynamo (which a torch
optimizer imports on its first use) before it read its message and trained:
two sites' rounds waited on it, side by side on the same cores. A local federation (`local_clients: true`)
starts one warm process (`serve`) beside its SuperNodes. It imports what a ClientApp imports, then forks a child
per request; the child is exactly what the `flwr-clientapp` wrapper would have run (guard.py's `run_guarded`,
with the FAB check), with the wrapper's standard streams, working folder, environment and arguments.

The `flwr-clientapp` wrapper the launcher writes for a local federation runs this file as a script
(`request`), with the standard library only (no site-packages: it starts in milliseconds). It hands its
arguments and its standard streams to the warm process over a Unix socket in the owner-only wrapper folder
and exits with the child's status. If the warm process is not listening (not started yet, or ended), the
wrapper runs the guard itself, in a new process, as before: slower, never different.

What the child shares with the warm process: imported modules only. The warm process reads no message, no job
and no row; it takes the FAB's expected hash from its own command line (the launcher's), never from a request;
it serves only connections from its own user. A forked child draws its global random states afresh, as a new
process does: Python's `random` is reseeded at fork by Python itself, NumPy's global generator and torch's default
one here, from the OS (a new process seeds both from the OS too). The privacy noise never comes from these: it
comes from the site's secret streams, and the ClientApp's code passes its own generators everywhere.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Callable
from pathlib import Path

SOCKET_NAME = "clientapp.sock"  # in the launcher's owner-only wrapper folder (guard.py's GUARD_DIR)
WRAPPED = "flwr-clientapp"
STREAMS = 3  # stdin, stdout, stderr, handed over with each request
MAX_REQUEST_BYTES = 1 << 20  # arguments and environment: kilobytes
REQUEST_TIMEOUT_S = 5.0


# ---------------------------------------------------------------------------------------- the launcher's side


def write_wrapper(bin_dir: Path, expected: str) -> Path:
    """`bin_dir/flwr-clientapp` (mode 0700, replacing guard.py's): asks the warm process at
    `bin_dir/clientapp.sock`; its path. This file runs as a script, without site-packages (`-S`)."""
    import shlex

    from dpsynth.models.generators.dpfedctgan.federation.guard import write_wrapper_script

    python, script, where = (
        shlex.quote(str(x)) for x in (sys.executable, Path(__file__).resolve(), bin_dir / SOCKET_NAME)
    )
    return write_wrapper_script(bin_dir / WRAPPED, f'exec {python} -P -S {script} {where} {expected} "$@"')


def serve_argv(bin_dir: Path, expected: str) -> list[str]:
    """The warm process's command line, for the launcher to start beside the SuperNodes."""
    return [sys.executable, "-P", "-m", __name__, "serve", str(bin_dir / SOCKET_NAME), expected]


# ---------------------------------------------------------------------------------------- the wrapper's side


def _at(path: str, act: Callable[[str], object]) -> None:
    """`act(name)` with the working folder at `path`'s folder: a Unix socket's path is at most 107 bytes, and a
    run's folder can be deeper than that."""
    before = os.getcwd()
    os.chdir(os.path.dirname(os.path.abspath(path)))
    try:
        act(os.path.basename(path))
    finally:
        os.chdir(before)


GUARD_MODULE = "dpsynth.models.generators.dpfedctgan.federation.guard"


def _guard_argv(expected: str, args: list[str]) -> list[str]:
    return [sys.executable, "-P", "-m", GUARD_MODULE, WRAPPED, expected, *args]


def _exit_code(status: int) -> int:
    """A shell's exit code for a child's wait status (128 + the signal that ended it)."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def request(socket_path: str, expected: str, args: list[str]) -> int:
    """Ask the warm process at `socket_path` to run the ClientApp with `args`; its exit code. Without a warm
    process listening, the guard runs here (`exec`), as the plain wrapper runs it."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _at(socket_path, client.connect)
    except OSError:
        client.close()
        os.execv(sys.executable, _guard_argv(expected, args))
    payload = json.dumps({"args": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    with client:
        socket.send_fds(client, [struct.pack("!I", len(payload)) + payload], list(range(STREAMS)))
        answer = b""
        while b"\n" not in answer and (chunk := client.recv(64)):
            answer += chunk
    try:
        return _exit_code(int(answer.decode().strip()))
    except ValueError:
        return 1  # the warm process ended before the child did


# ---------------------------------------------------------------------------------------- the warm side


def warm_imports() -> None:
    """What every ClientApp imports before it reads its message (client.py and what it calls)."""
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401 - a ClientApp's first optimizer imports it (torch._compile): 1.8 s of a round
    from flwr.supernode.cli import flwr_clientapp  # noqa: F401
    from flwr.supernode.runtime import run_clientapp  # noqa: F401

    from dpsynth.models.generators.dpfedctgan import conditions, local_training  # noqa: F401
    from dpsynth.models.generators.dpfedctgan.federation import client, guard, job  # noqa: F401
    from dpsynth.models.privacy import secret  # noqa: F401


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """The request's arguments, working folder and environment, and its three streams; ValueError (the streams
    closed) for anything else."""
    data, fds, _flags, _addr = socket.recv_fds(conn, MAX_REQUEST_BYTES + 4, STREAMS)
    try:
        if len(fds) != STREAMS or len(data) < 4:
            raise ValueError("not a request: no streams or no length")
        (length,) = struct.unpack("!I", data[:4])
        if length > MAX_REQUEST_BYTES:
            raise ValueError("request too large")
        body = data[4:]
        while len(body) < length:
            chunk = conn.recv(length - len(body))
            if not chunk:
                raise ValueError("request cut short")
            body += chunk
        request_ = json.loads(body)
        if not isinstance(request_, dict) or not {"args", "cwd", "env"} <= request_.keys():
            raise ValueError("not a request")
        return request_, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


def _run_child(held: list[socket.socket], request_: dict, fds: list[int], expected: str) -> None:
    """In the forked child: become the process the wrapper would have started, run the guarded ClientApp, exit.
    `held`: the warm process's sockets (its listener, every wrapper's connection), none of them the child's."""
    code = 1
    try:
        for held_socket in held:
            held_socket.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request_["cwd"])
        os.environ.clear()
        os.environ.update(request_["env"])
        import numpy as np
        import torch

        np.random.seed()  # as a new process seeds them (the OS's entropy), not the warm process's states
        torch.seed()

        from dpsynth.models.generators.dpfedctgan.federation.guard import run_guarded

        code = run_guarded(WRAPPED, expected, list(request_["args"]))
    except SystemExit as stop:  # Flower ends its app processes with sys.exit
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported on the wrapper's stderr, as a new process would
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a closed stream: nothing left to flush
                pass
        os._exit(code)


def serve(socket_path: str, expected: str) -> None:
    """Import what a ClientApp imports, then fork a child per request until stopped (the launcher stops the
    process group, children included) or until the launcher has ended."""
    import selectors

    warm_imports()
    path = os.path.abspath(socket_path)
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)
    try:
        _at(path, listener.bind)  # owner-only, in an owner-only folder
    finally:
        os.umask(old_mask)
    listener.listen(16)
    waiting: dict[int, socket.socket] = {}  # child pid -> the wrapper waiting for its status
    chosen = selectors.DefaultSelector()
    chosen.register(listener, selectors.EVENT_READ)
    launcher = os.getppid()
    while os.getppid() == launcher:  # a launcher killed outright leaves no warm process behind
        for _key, _events in chosen.select(timeout=0.05):
            conn, _ = listener.accept()
            conn.settimeout(REQUEST_TIMEOUT_S)  # a client that never sends holds up no other
            try:
                if not _same_user(conn):
                    conn.close()
                    continue
                request_, fds = _read_request(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            conn.settimeout(None)
            for stream in (sys.stdout, sys.stderr):
                stream.flush()  # nothing of the warm process's own output in the child's streams
            pid = os.fork()
            if pid == 0:
                _run_child([listener, conn, *waiting.values()], request_, fds, expected)
            for fd in fds:
                os.close(fd)
            waiting[pid] = conn
            print(f"clientapp: ClientApp process {pid} forked", flush=True)
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            finished = waiting.pop(pid, None)
            if finished is not None:
                try:
                    finished.sendall(f"{status}\n".encode())
                except OSError:
                    pass  # the wrapper is gone: nobody waits for this status
                finished.close()


def main(argv: list[str]) -> int:
    """`serve SOCKET SHA256` (the warm process, under the launcher) or `SOCKET SHA256 [ARGS...]` (the wrapper)."""
    if argv[:1] == ["serve"] and len(argv) == 3:
        serve(argv[1], argv[2])
        return 0
    if len(argv) < 2:
        print("usage: warm_clientapp [serve] SOCKET SHA256 [ARGS...]", file=sys.stderr)
        return 2
    return request(argv[0], argv[1], argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
