"""Only OUR Flower app, in OUR run, runs in a federation's app processes.

Why: the SuperLink's Control API (where `flwr run` submits a run) listens on loopback with TLS but no
client authentication (Flower's open-source SuperLink has no Control API authentication but its
enterprise plugins). Any local user who reaches the port could submit a Flower app bundle (FAB) of their
own: the SuperLink would start its ServerApp, and our SuperNodes its ClientApp, as OUR user, next to the
sites' real rows. Or they could submit OUR app with a run config of their own, and our apps would train on
the real rows for their run (privacy spent, and not accounted).

Two checks close this:

1. The FAB. Flower's SuperExec starts an app's process by bare command name, found on PATH
   (`flwr.supercore.constant.TASK_TYPE_TO_COMMAND`: `flwr-serverapp`, `flwr-clientapp`, `flwr-simulation`,
   ...). The launcher starts the SuperLink and every SuperNode with PATH beginning with an owner-only folder
   of wrappers it writes (`write_guards`): `flwr-serverapp` and `flwr-clientapp` run Flower's own entry
   points, with the FAB's installation (`install_from_fab`, called before any of the app's files are
   unpacked or imported) replaced by one that refuses a FAB whose SHA-256 is not that of the app the
   launcher submits (`flwr run` builds the FAB deterministically, `flwr.cli.build.build_fab_from_disk`,
   and the launcher builds the same bytes itself; the digest is written into the wrappers, never read
   from anything a run sends). Every other app command refuses outright.
2. The run. The launcher records its run's id (`flwr run`'s answer) in the job folder (`run_id`,
   owner-only) right after submitting; the ServerApp and the ClientApp refuse any run whose
   `context.run_id` differs (`our_run`), before reading the job or any site's rows. The job folder they
   trust is the one the launcher puts in the environment of the processes it starts (`FOLDER_ENV`), not
   the run config a run brings.

What this does not cover: SuperNodes on other machines (`local_clients: false`) run whatever
`flwr-clientapp` their own PATH finds, and their ClientApp has no run id to compare; there the SuperLink
must sit on a network only the sites reach (docs/generators.md).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

GUARD_DIR = "flwr-bin"  # in the run's federation folder, owner-only
RUN_ID_FILE = "run_id"  # in the job folder, owner-only: the launcher's run
FOLDER_ENV = "DPSYNTH_FEDERATION_FOLDER"  # the job folder, set by the launcher for every process it starts
RUN_ID_WAIT_S = 15.0  # how long an app waits for the launcher to record its run (it may start first)
# Flower's entry point of each app command we run, and the module whose `install_from_fab` it calls.
GUARDED = {
    "flwr-serverapp": ("flwr.server.serverapp.app", "flwr_serverapp"),
    "flwr-clientapp": ("flwr.supernode.runtime.run_clientapp", None),
}
# Every other app command Flower 1.32 knows of; write_guards adds any that a later Flower lists.
REFUSED = ("flwr-simulation", "flwr-agentapp", "flwr-model", "flwr-connector")


class RunRefused(RuntimeError):
    """A FAB or a run that is not the launcher's: refused before any of it runs or any row is read."""


def fab_sha256(app: Path) -> str:
    """The SHA-256 of the FAB `flwr run` builds from `app` (the same function, the same bytes)."""
    from flwr.cli.build import build_fab_from_disk

    return hashlib.sha256(build_fab_from_disk(app)).hexdigest()


def app_commands() -> list[str]:
    """Every command name Flower's SuperExec may start an app process with."""
    from flwr.supercore.constant import TASK_TYPE_TO_COMMAND

    return sorted(set(TASK_TYPE_TO_COMMAND.values()) | set(GUARDED) | set(REFUSED))


def write_guards(folder: Path, fab_hash: str) -> Path:
    """An owner-only folder `folder/flwr-bin` with one wrapper (mode 0700) per app command; its path,
    to put first on the PATH of the SuperLink and the SuperNodes."""
    if len(fab_hash) != 64 or any(ch not in "0123456789abcdef" for ch in fab_hash):
        raise ValueError(f"not a SHA-256 digest: {fab_hash!r}")
    bin_dir = folder / GUARD_DIR
    bin_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(bin_dir, 0o700)
    python = shlex.quote(sys.executable)
    for command in app_commands():
        # -P: no working directory on sys.path (the app process's cwd is not ours to trust).
        write_wrapper_script(bin_dir / command, f'exec {python} -P -m {__name__} {command} {fab_hash} "$@"')
    return bin_dir


def write_wrapper_script(path: Path, command: str) -> Path:
    """`path`, a new owner-only (0700) shell script that runs `command`, replacing what was there; its path."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"#!/bin/sh\n{command}\n")
    return path


def refuse_foreign_fab(fab: Any, expected: str) -> None:
    """RunRefused unless `fab` (the FAB's bytes, or a path to them) hashes to `expected`."""
    content = fab.read_bytes() if isinstance(fab, Path) else fab
    if not isinstance(content, bytes):
        raise RunRefused(f"refused a FAB given as {type(fab).__name__}")
    digest = hashlib.sha256(content).hexdigest()
    if digest != expected:
        raise RunRefused(
            f"refused a Flower app bundle that is not this federation's (SHA-256 {digest[:16]}..., expected "
            f"{expected[:16]}...): nothing of it was installed or run"
        )


def run_guarded(command: str, expected: str, args: list[str]) -> int:
    """Flower's own entry point of `command`, with its FAB installation refusing a foreign FAB."""
    module_name, entry = GUARDED[command]
    module = importlib.import_module(module_name)
    install = getattr(module, "install_from_fab", None)
    if install is None:  # a Flower whose app process installs FABs elsewhere: refuse rather than guess
        print(f"{command}: this Flower's FAB installation cannot be checked; refused", file=sys.stderr)
        return 3

    def checked_install(fab: Any, *rest: Any, **kwargs: Any) -> Any:
        refuse_foreign_fab(fab, expected)
        return install(fab, *rest, **kwargs)

    module.install_from_fab = checked_install  # type: ignore[attr-defined]
    sys.argv = [command, *args]
    if entry is None:  # flwr-clientapp's entry point lives in the CLI module and calls run_clientapp
        from flwr.supernode.cli.flwr_clientapp import flwr_clientapp

        flwr_clientapp()
    else:
        getattr(module, entry)()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -P -m ...guard COMMAND SHA256 [Flower's arguments]`: what each wrapper runs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2:
        print("usage: guard COMMAND SHA256 [ARGS...]", file=sys.stderr)
        return 2
    command, expected, args = argv[0], argv[1], argv[2:]
    if command not in GUARDED:
        print(
            f"{command}: refused: this federation runs its own ServerApp and ClientApp only "
            "(dpsynth.models.generators.dpfedctgan.federation.guard)",
            file=sys.stderr,
        )
        return 2
    return run_guarded(command, expected, args)


# ------------------------------------------------------------------------------ the run


def write_run_id(folder: Path, run_id: int) -> None:
    """The launcher's run id in `folder/run_id` (owner-only; atomic: an app never reads half of it)."""
    tmp = folder / f".{RUN_ID_FILE}.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{int(run_id)}\n")
    os.replace(tmp, folder / RUN_ID_FILE)


def _recorded_run(folder: Path, wait_s: float) -> int | None:
    path = folder / RUN_ID_FILE
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return int(path.read_text().strip())
        except (FileNotFoundError, ValueError):
            if time.monotonic() > deadline:
                return None
        time.sleep(0.05)


def our_run(run_id: int, claimed: object, *, required: bool, wait_s: float = RUN_ID_WAIT_S) -> Path:
    """The job folder, once `run_id` is the launcher's run and `claimed` (the folder the run's config or
    the node's config names) is the launcher's job folder; RunRefused otherwise. Without the launcher's
    folder in the environment: RunRefused when `required` (the ServerApp, always under the launcher's
    SuperLink), else `claimed` unchecked (a SuperNode on another machine: nothing to compare with)."""
    trusted = os.environ.get(FOLDER_ENV, "")
    if not trusted:
        if required:
            raise RunRefused(f"refused run {run_id}: not started under the federation launcher ({FOLDER_ENV} unset)")
        return Path(str(claimed))
    folder = Path(trusted).resolve()
    if Path(str(claimed)).resolve() != folder:
        raise RunRefused(f"refused run {run_id}: its folder {str(claimed)!r} is not this federation's")
    recorded = _recorded_run(folder, wait_s)
    if recorded != int(run_id):
        raise RunRefused(
            f"refused run {run_id}: this federation's run is {recorded}"
            if recorded is not None
            else f"refused run {run_id}: the launcher recorded no run within {wait_s:g} s"
        )
    return folder


if __name__ == "__main__":
    sys.exit(main())
