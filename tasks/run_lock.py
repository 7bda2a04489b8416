"""One process per run folder: an exclusive OS lock (flock) on `<run folder>/run.lock`, held from before
the run's first write until it ends.

Two identical commands at once (a scheduled run and a steward's rerun) find the same run folder; run
together, each would remove or overwrite the other's stage outputs. The second is refused instead
(RunInProgressError), having written nothing. The OS drops the lock when its process dies, even by
SIGKILL, so a killed run's rerun is never blocked by a stale lock file.
"""

from __future__ import annotations

import fcntl
import os
from datetime import UTC, datetime
from pathlib import Path

from dpsynth.models.errors import RunInProgressError

LOCK_FILE = "run.lock"

# Run folders this process holds, by resolved path: the command line's preflight takes the lock and the
# flow it then runs in the same process finds it held (flock would refuse a second open file).
_held: dict[Path, int] = {}


def lock_run(run_dir: Path, run_id: str) -> None:
    """Hold `run_dir`'s lock for this process (no-op if it already does), or refuse at once if another
    process holds it. `run_dir` must exist."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode(errors="replace").strip()
        os.close(fd)
        raise RunInProgressError(
            f"The run {run_id} (folder {str(key)!r}) is being run by another process now "
            f"({holder or 'its pid unknown'}); "
            "two processes must never run the same run at once, so this one did nothing and spent nothing. "
            "Wait for that process to end (the same command then reuses its result, or resumes it if it "
            "failed), or follow its progress in the run folder's run.json."
        ) from None
    except BaseException:
        os.close(fd)
        raise
    # Who holds it, for the refusal above (only the holder writes here).
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}, since {datetime.now(UTC).isoformat(timespec='seconds')}\n".encode())
    _held[key] = fd


def refuse_if_running(run_dir: Path, run_id: str) -> None:
    """The command line's early check, before it reads the table: if `run_dir` exists, take its lock now
    (held on, so no other process can start it between this check and the flow)."""
    if Path(run_dir).is_dir():
        lock_run(run_dir, run_id)


def unlock_run(run_dir: Path) -> None:
    """Let go of `run_dir`'s lock, if this process holds it (the run ended, or the command did)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor drops the flock


def unlock_all() -> None:
    """Let go of every run this process holds (the end of a command-line command)."""
    for run_dir in list(_held):
        unlock_run(run_dir)
