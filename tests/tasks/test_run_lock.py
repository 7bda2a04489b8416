"""One process per run folder (tasks/run_lock.py): a second process on a run in progress is refused and
writes nothing; the lock of a process killed by SIGKILL is gone with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from dpsynth.models.errors import RunInProgressError
from dpsynth.tasks.context import load_context, open_run
from dpsynth.tasks.run_lock import lock_run, unlock_run
from tests.conftest import CARDIO_SCHEMA, ROOT

HOLDER = """
import sys, time
from pathlib import Path
from dpsynth.tasks.run_lock import lock_run
lock_run(Path(sys.argv[1]), "the-run")
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def held_by_another_process():
    """Start a process holding a run folder's lock; yields (start(run_dir) -> process)."""
    started = []

    def start(run_dir):
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        started.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _files(folder) -> dict:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_a_run_held_by_another_process_is_refused_with_its_pid_and_after_a_sigkill_is_free(
    tmp_path, held_by_another_process
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = held_by_another_process(run_dir)
    with pytest.raises(RunInProgressError) as refused:
        lock_run(run_dir, "the-run")
    assert refused.value.exit_code == 9
    assert "the-run" in str(refused.value) and f"pid {holder.pid}" in str(refused.value)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    lock_run(run_dir, "the-run")  # the lock file is still there; the lock went with its process
    unlock_run(run_dir)


def test_open_run_on_a_run_in_progress_changes_nothing_in_its_folder(
    tmp_path, demo_csv, private_home, held_by_another_process
):
    ctx = load_context(str(CARDIO_SCHEMA), str(demo_csv), "smoke", str(tmp_path / "run"), "release")
    open_run(ctx)
    unlock_run(ctx.run_dir)  # as if this process had been killed: another one now runs it
    held_by_another_process(ctx.run_dir)
    before = _files(ctx.run_dir)
    again = load_context(str(CARDIO_SCHEMA), str(demo_csv), "smoke", str(tmp_path / "run"), "release")
    with pytest.raises(RunInProgressError, match="another process"):
        open_run(again)
    assert _files(ctx.run_dir) == before
    assert json.loads((ctx.run_dir / "run.json").read_text())["status"] == "running"
