"""The processes a federation launcher starts (the SuperLink, the SuperNodes, the warm process the local
ClientApps are forked from), each the leader of a process group of its own, and how they end.

Flower's processes start others: the SuperLink a SuperExec that starts the ServerApp's process, each
SuperNode a SuperExec that starts a `flwr-clientapp` wrapper per request, whose ClientApp the warm process
forks (warm_clientapp.py). Those inherit their parent's process group, so stopping a group (SIGTERM, then
SIGKILL once its leader has ended, or after a grace) stops them too, even when their parent died first (a
killed SuperNode leaves its ClientApp behind otherwise). Only the groups this launcher made are signalled,
each by its own id.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PIDS_FILE = "processes.json"
STOP_GRACE_SECONDS = 3.0  # a group still running that long after SIGTERM is killed


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id was reused by another user's group: none of ours is left
        return False
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Processes:
    """The process groups this launcher started, by name, and their logs (`logs/NAME.log`)."""

    folder: Path
    env: dict[str, str]
    started: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        logs = self.folder / "logs"
        logs.mkdir(exist_ok=True)
        with open(logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True, cwd=self.folder
            )
        self.started[name] = proc
        self.record()
        return proc

    def record(self) -> None:
        """Each group's id (its leader's pid) in `processes.json`: what the tests check has ended."""
        (self.folder / PIDS_FILE).write_text(json.dumps({name: p.pid for name, p in self.started.items()}))

    def stop(self) -> None:
        """SIGTERM every group still holding a process; SIGKILL a group as soon as its leader has ended, and
        every group still running after a grace; reap the leaders. What a leader that ended leaves behind are
        Flower's helpers (a SuperExec, a finished ServerApp's process): they hold nothing of the run's (its
        checkpoints are written atomically, before the round is reported) and end on SIGTERM only at Flower's
        own exit timeout, seconds later, which every federation's stop would otherwise wait out."""
        leaders = {p.pid: p for p in self.started.values()}
        for pgid in leaders:
            _signal_group(pgid, signal.SIGTERM)
        running = set(leaders)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while running and time.monotonic() < deadline:
            for pgid in list(running):
                if leaders[pgid].poll() is not None:  # reaped: a zombie leader still counts as the group's member
                    _signal_group(pgid, signal.SIGKILL)
                    running.discard(pgid)
            if running:
                time.sleep(0.05)
        for pgid in leaders:
            _signal_group(pgid, signal.SIGKILL)
        for p in leaders.values():
            p.wait()
        # The killed group's children are reparented to init, which reaps them: wait until none is left.
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while any(group_alive(g) for g in leaders) and time.monotonic() < deadline:
            time.sleep(0.05)

    def log_tail(self, name: str, lines: int = 5) -> str:
        path = self.folder / "logs" / f"{name}.log"
        text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
        return "\n".join(text[-lines:])
