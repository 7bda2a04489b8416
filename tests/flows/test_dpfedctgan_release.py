"""`dpsynth release --generator dpfedctgan` end to end on Flower's deployment engine: a SuperLink (which
runs the ServerApp) and two SuperNodes (which run the ClientApp), real processes on loopback inside the
train stage.

* A publishing release whose site 1 SuperNode is killed (SIGKILL) in the middle of a round fails with exit
  status 8 and a readable error, publishes nothing and leaves no process behind (not even the killed
  SuperNode's ClientApp); its rerun resumes after the last completed round (the ServerApp runs only the
  round left, the earlier checkpoints stay as they were) and publishes the worst site's epsilon.
* A trial (`--no-publish`) runs every stage and publishes nothing.

Sized for speed: tiny networks, two rounds of a few updates, timeouts that fail within a minute. What
costs is the processes' start (torch and Flower: seconds each): the SuperLink and SuperNodes once per
federation, a ClientApp process per request; one federation for the trial, two (the killed one and its
rerun) for the publishing release.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth.flows.cli import main
from dpsynth.models.config import load_profile
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.generators import get
from dpsynth.tasks.ledger import entries as ledger_entries
from dpsynth.tasks.registry import registry_client
from tests.conftest import CARDIO_SCHEMA, publishing_smoke
from tests.flows.test_release_flow import _last_json

MODEL = "cardio-dpfedctgan"
# Two IID sites, two rounds of two updates, networks of 16 units: the processes' start is the cost (a SuperLink, a
# SuperNode and a SuperExec per site, the ServerApp), so two sites, not the smoke profile's three.
SMALL = {
    "sites": {"iid": 2},
    "rounds": 2,
    "checkpoint_every": 1,
    "local_steps": 2,
    "sample_rate": 0.02,
    "z_dim": 8,
    "generator_hidden": [16],
    "discriminator_hidden": [16],
    "connect_timeout_s": 60.0,
    "round_timeout_s": 60.0,
}
# Round 2 of the killed release long enough (tens of updates) for the kill to land inside it.
KILLED = {**SMALL, "local_steps": 30}
# Flower's SuperNode log: one of each per training round (the counts come as a `query` message).
RECEIVED = "Receiving: train message"
SENT = "Sending: train message"


def _argv(demo_csv: Path, profile: str, *more: str) -> list[str]:
    return ["release", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile", profile,
            "--generator", "dpfedctgan", "--json", *more]  # fmt: skip


def _plan(profile_arg: str):
    profile = load_profile(profile_arg, CARDIO_SCHEMA).with_generator("dpfedctgan")
    return get("dpfedctgan").plan(profile, profile.release_target())


def _versions() -> list:
    return registry_client().search_model_versions(f"name = '{MODEL}'")


def _assert_processes_ended(federation: Path) -> None:
    """No process is left in a group the launcher started (the SuperLink's and SuperNodes', with the
    SuperExecs and app processes they started), nor anywhere with the federation folder as its directory
    (every process the launcher starts, and theirs, begins there)."""
    for pgid in json.loads((federation / "processes.json").read_text()).values():
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
    left = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")) == federation.resolve():
                left.append(proc.name)
        except OSError:
            continue
    assert left == []


class MidRoundKiller(threading.Thread):
    """SIGKILLs site `site`'s SuperNode once it has received training round `round_index` and before it
    replies (its log has one training request per round), and records whether it did. It watches until
    `stop` is set (the release has ended), however long the stages before the round take on a busy machine:
    a release that ends without the kill leaves `killed_mid_round` None, and the test fails on it."""

    def __init__(self, workdir: Path, site: int, round_index: int):
        super().__init__(daemon=True)
        self.workdir, self.site, self.round_index = workdir, site, round_index
        self.stop = threading.Event()
        self.killed_mid_round: bool | None = None  # None: never killed

    def run(self) -> None:
        while not self.stop.is_set():
            logs = list(self.workdir.glob(f"runs/release/*/train-k10/federation/logs/site-{self.site}.log"))
            text = logs[0].read_text(errors="replace") if logs else ""
            if text.count(RECEIVED) >= self.round_index:
                federation = logs[0].parent.parent
                pid = json.loads((federation / "processes.json").read_text())[f"site-{self.site}"]
                os.kill(pid, signal.SIGKILL)
                self.killed_mid_round = text.count(SENT) == self.round_index - 1
                return
            time.sleep(0.01)


def test_a_client_killed_mid_round_fails_the_release_and_the_rerun_resumes_and_publishes(
    isolated_workdir, demo_csv, capfd, tmp_path
):
    profile_arg = publishing_smoke(tmp_path / "profiles", dpfedctgan=KILLED)
    plan = _plan(profile_arg)
    assert plan.iterations == (0, 1, 2)
    killer = MidRoundKiller(isolated_workdir, site=1, round_index=2)
    killer.start()
    try:
        assert main(_argv(demo_csv, profile_arg)) == 8
    finally:
        killer.stop.set()
        killer.join()
    err = capfd.readouterr().err
    assert killer.killed_mid_round is True
    assert "Site 1's client stopped with exit status -9 during round 2 of 2" in err and "rerun the release" in err
    (run_dir,) = (isolated_workdir / "runs" / "release").iterdir()
    federation, checkpoints = run_dir / "train-k10" / "federation", run_dir / "train-k10" / "checkpoints"
    _assert_processes_ended(federation)
    state = json.loads((checkpoints / "federation.json").read_text())
    assert state["round"] == 1 and [e["iteration"] for e in state["checkpoints"]] == [0, 1]
    assert _versions() == [] and ledger_entries("cardio") == []  # nothing published, nothing spent

    assert main(_argv(demo_csv, profile_arg)) == 0
    summary = _last_json(capfd)
    assert summary["run_dir"].endswith(run_dir.name)
    # Resumed: the ServerApp ran the counts and the one round left; rounds 0 and 1 are the killed run's.
    starts = re.findall(r"serverapp: counts, then rounds (\d+) to 2", (federation / "logs" / "server.log").read_text())
    assert starts == ["1", "2"]
    resumed = json.loads((checkpoints / "federation.json").read_text())
    assert resumed["round"] == 2 and resumed["checkpoints"][:2] == state["checkpoints"]
    _assert_processes_ended(federation)

    ledger = json.loads((run_dir / "train-k10" / "ledger.json").read_text())["checkpoints"]
    assert [e["iteration"] for e in ledger] == list(plan.iterations)
    assert summary["published"] is True and summary["model_uri"] == f"models:/{MODEL}/1"
    assert summary["epsilon_training"] == pytest.approx(plan.epsilon, rel=1e-12)
    assert [int(v.version) for v in _versions()] == [1] and [e.status for e in ledger_entries("cardio")] == [
        "published"
    ]
    # Each site held its own rows only: the training rows split between the two.
    sizes = [len(np.load(federation / f"site-{k}" / "rows.npy")) for k in range(2)]
    assert not (federation / "site-2").exists()
    assert all(s > 0 for s in sizes) and sum(sizes) == len(np.load(run_dir / "prepare-k10" / "train_rows.npy"))


def test_a_federated_trial_runs_every_stage_and_publishes_nothing(isolated_workdir, demo_csv, capfd, tmp_path):
    profile_arg = publishing_smoke(tmp_path / "profiles", trial=True, dpfedctgan=SMALL)
    plan = _plan(profile_arg)
    assert main(_argv(demo_csv, profile_arg, "--no-publish")) == 0
    summary = _last_json(capfd)
    assert summary["published"] is False and summary["trial"] is True
    assert summary["epsilon_training"] == pytest.approx(plan.epsilon, rel=1e-12)
    out = isolated_workdir / summary["run_dir"]
    assert not (out / "bundle").exists() and (out / "report" / "report.html").exists()
    assert _versions() == [] and ledger_entries("cardio") == []
    ledger = json.loads((out / "train-k10" / "ledger.json").read_text())["checkpoints"]
    assert [e["iteration"] for e in ledger] == list(plan.iterations) == [0, 1, 2]
    rows = pd.read_parquet(out / "sample-k10" / "synthetic_000002.parquet")
    assert list(rows.columns) == DatasetSchema.from_yaml(CARDIO_SCHEMA).column_names and len(rows) > 0
    federation = out / "train-k10" / "federation"
    # Every ClientApp the sites' SuperExecs started (the counts, then each round) was forked from the warm process.
    started = sum(log.read_text().count("Start `flwr-clientapp` process") for log in federation.glob("logs/site-*.log"))
    assert started == 2 * 3 and (federation / "logs" / "clientapps.log").read_text().count("forked") == started
    _assert_processes_ended(federation)
