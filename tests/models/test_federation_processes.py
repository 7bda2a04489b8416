"""How the federation launcher's process groups end (federation/processes.py), with plain shell processes in
place of Flower's: a group whose leader ends on SIGTERM is killed at once with what it left behind, a leader
that ignores SIGTERM is killed with its group after the grace, and no process of either is left."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from dpsynth.models.generators.dpfedctgan.federation.processes import STOP_GRACE_SECONDS, Processes

# A leader that ends on SIGTERM (sh's default) and a child that ignores it (as Flower's SuperExec and a finished
# ServerApp's process do for seconds, until Flower's own exit timeout); the child writes its pid once started.
LINGERING_CHILD = "echo $$ > lingering.pid.tmp; mv lingering.pid.tmp lingering.pid; exec sleep 60"
LEADER_ENDS_CHILD_LINGERS = ["sh", "-c", f"(trap '' TERM; exec sh -c '{LINGERING_CHILD}') & wait"]
LEADER_IGNORES_TERM = ["sh", "-c", 'trap "" TERM; echo $$ > stubborn.pid; while :; do sleep 0.1; done']


def _started(procs: Processes, name: str, argv: list[str]) -> int:
    """The pid the started group's process wrote (its lingering child's, or its own)."""
    procs.start(name, argv)
    deadline = time.monotonic() + 30
    while not (procs.folder / f"{name}.pid").exists():
        assert time.monotonic() < deadline, f"{name} did not start"
        time.sleep(0.02)
    return int((procs.folder / f"{name}.pid").read_text())


def _ended(pid: int) -> bool:
    """Ended: gone, or a zombie waiting for init to reap it (which this machine's init may take a while to do)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _gone(pgid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def test_a_group_whose_leader_ended_is_killed_at_once_with_what_it_left(tmp_path):
    procs = Processes(tmp_path, dict(os.environ))
    child = _started(procs, "lingering", LEADER_ENDS_CHILD_LINGERS)
    stopping = threading.Thread(target=procs.stop)
    started = time.monotonic()
    stopping.start()
    while not _ended(child) and time.monotonic() - started < 2 * STOP_GRACE_SECONDS:
        time.sleep(0.01)
    ended = time.monotonic() - started
    stopping.join()
    # Its leader ends on SIGTERM at once; the child that ignores SIGTERM once held the stop for the whole grace.
    assert ended < STOP_GRACE_SECONDS / 2
    _gone(procs.started["lingering"].pid)


def test_a_leader_that_ignores_sigterm_is_killed_with_its_group_after_the_grace(tmp_path):
    procs = Processes(tmp_path, dict(os.environ))
    _started(procs, "lingering", LEADER_ENDS_CHILD_LINGERS)
    _started(procs, "stubborn", LEADER_IGNORES_TERM)
    started = time.monotonic()
    procs.stop()
    assert time.monotonic() - started >= STOP_GRACE_SECONDS
    for proc in procs.started.values():
        _gone(proc.pid)
