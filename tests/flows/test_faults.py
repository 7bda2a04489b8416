"""Faults a release must survive with a clear message and nothing lost: an output folder it cannot write,
an unreachable tracking store, a disk that fills while a checkpoint is written, a SIGKILL inside each long
stage, and two releases of the same table at once. Every case ends with nothing published from the failed
attempt, and the ledger counts exactly what was published."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from dpsynth.flows.cli import main
from dpsynth.tasks.ledger import entries as ledger_entries
from dpsynth.tasks.registry import registry_client
from tests.conftest import CARDIO_SCHEMA, ROOT, publishing_smoke

MODEL = "cardio-gswgan"


def _argv(data, *more):
    """A publishing smoke release of `data` (the profile written beside it, in the test's folder)."""
    profile = publishing_smoke(Path(data).parent / "profiles")
    return ["release", "--config", str(CARDIO_SCHEMA), "--data", str(data), "--profile", profile, *more]


def _versions(name=MODEL) -> list:
    # This test's store (MLflow's process-wide URI may still name an earlier test's).
    return registry_client().search_model_versions(f"name = '{name}'")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _written(f) -> Path:
    """The file a torch.save call writes: a path, or a file object's (checkpoints pass one)."""
    return Path(getattr(f, "name", f))


def test_an_output_folder_that_cannot_be_written_is_a_readable_error(isolated_workdir, demo_csv, capfd):
    blocker = isolated_workdir / "not-a-folder"
    blocker.write_text("a file where the run folder's parent should be")
    assert main(_argv(demo_csv, "--out", str(blocker / "run"))) == 7
    err = capfd.readouterr().err
    assert "cannot use" in err and "not-a-folder" in err and "Traceback" not in err
    assert ledger_entries("cardio") == []


def test_an_unreachable_tracking_store_stops_the_release_before_any_work(
    isolated_workdir, demo_csv, capfd, monkeypatch
):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_closed_port()}")
    assert main(_argv(demo_csv, "--out", str(isolated_workdir / "run"))) == 7
    err = capfd.readouterr().err
    assert "tracking store" in err and "Nothing was started" in err and "Traceback" not in err
    assert not (isolated_workdir / "run").exists()


def test_a_full_disk_while_a_checkpoint_is_written_loses_nothing(isolated_workdir, demo_csv, capfd, monkeypatch):
    real_save = torch.save

    def disk_fills_at_checkpoint_40(obj, f, *args, **kwargs):
        if _written(f).name.startswith("generator_000040"):
            _written(f).write_bytes(b"the first blocks of a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a failed write: no file named
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_fills_at_checkpoint_40)
    assert main(_argv(demo_csv)) == 7
    err = capfd.readouterr().err
    assert "No space left on device" in err and "generator_000040" in err and "Traceback" not in err
    (run,) = (isolated_workdir / "runs" / "release").iterdir()
    checkpoints = run / "train-k10" / "checkpoints"
    assert (checkpoints / "generator_000020.pt").exists() and not (checkpoints / "generator_000040.pt").exists()
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    assert not (run / "bundle").exists() and ledger_entries("cardio") == []

    monkeypatch.setattr(torch, "save", real_save)  # space again: the same command resumes and publishes
    assert main(_argv(demo_csv, "--json")) == 0
    summary = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert summary["run_dir"] == str(run) and len(_versions()) == 1
    assert [e.status for e in ledger_entries("cardio")] == ["published"]


def test_a_registry_failure_while_publishing_publishes_nothing_and_a_rerun_does(
    isolated_workdir, demo_csv, capfd, monkeypatch
):
    from mlflow.exceptions import MlflowException

    import dpsynth.tasks.registry

    def store_gone(*args, **kwargs):
        raise MlflowException("API request to http://tracking:5000 failed: connection refused")

    real = dpsynth.tasks.registry.log_release_model
    monkeypatch.setattr(dpsynth.tasks.registry, "log_release_model", store_gone)
    assert main(_argv(demo_csv)) == 7
    err = capfd.readouterr().err
    assert "tracking store failed" in err and "Nothing was published" in err and "Traceback" not in err
    (run,) = (isolated_workdir / "runs" / "release").iterdir()
    assert not (run / "bundle").exists() and ledger_entries("cardio") == [] and not _versions()
    monkeypatch.setattr(dpsynth.tasks.registry, "log_release_model", real)  # the store answers again
    assert main(_argv(demo_csv)) == 0
    assert len(_versions()) == 1 and [e.status for e in ledger_entries("cardio")] == ["published"]
    assert (run / "bundle" / "release.json").exists()


def _subprocess_env(workdir: Path, **more) -> dict:
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}",
            "PREFECT_API_URL": PREFECT_API_URL.value() or "",
            **more,
        }
    )  # the session's test server
    return env


def _dpsynth(workdir: Path, argv: list[str], kill_inside: str | None = None, **env) -> subprocess.CompletedProcess:
    command = (
        [sys.executable, "-m", "tests.flows.kill_inside", kill_inside]
        if kill_inside
        else [sys.executable, "-m", "dpsynth.flows.cli"]
    )
    return subprocess.run(
        command + argv,
        cwd=workdir,
        env=_subprocess_env(workdir, **env),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_sigkill_inside_each_long_stage_then_a_rerun_ends_as_an_uninterrupted_release(
    isolated_workdir, demo_csv, capfd, monkeypatch
):
    """One release killed in each long stage in turn, each kill a process of its own (a SIGKILL ends it); its
    rerun to the end and the reference (the same run, never interrupted) run in the test's process."""
    argv = _argv(demo_csv, "--json")
    reference = isolated_workdir.parent / "reference"
    for stage, unfinished in (
        ("pretrain", "pretrain-k10"),
        ("train", "train-k10"),
        ("sample", "sample-k10"),
        ("select", "evaluate-k10/001"),
    ):
        killed = _dpsynth(isolated_workdir, argv, kill_inside=stage)
        assert killed.returncode == -9, (stage, killed.stderr[-2000:])
        (run,) = (isolated_workdir / "runs" / "release").iterdir()  # the same run, resumed each time
        assert not (run / unfinished / "manifest.json").exists(), stage
        assert json.loads((run / "run.json").read_text())["status"] == "running"
        assert (run / "run.lock").exists()  # left behind by the killed process; its lock went with it
        if stage == "pretrain":
            # The reference: the same run (its record and secret) from here on, never interrupted.
            shutil.copytree(run, reference)
            shutil.rmtree(reference / "pretrain-k10")
        assert not _versions() and ledger_entries("cardio") == [], stage  # nothing published, nothing spent
    capfd.readouterr()
    assert main(argv) == 0, capfd.readouterr().err[-3000:]
    resumed = json.loads(capfd.readouterr().out.strip().splitlines()[-1])

    elsewhere = isolated_workdir.parent / "reference-store"
    elsewhere.mkdir()
    with monkeypatch.context() as there:  # as a process started in `elsewhere` with its own MLflow store
        there.chdir(elsewhere)
        there.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{elsewhere / 'mlflow.db'}")
        assert main(argv[:-1] + ["--out", str(reference), "--json"]) == 0, capfd.readouterr().err[-3000:]
    uninterrupted = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    for key in ("iteration", "epsilon", "auc", "release_id"):
        assert resumed[key] == uninterrupted[key], key
    a = torch.load(run / "bundle" / "generator.pt", weights_only=True)["state_dict"]
    b = torch.load(reference / "bundle" / "generator.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    pd.testing.assert_frame_equal(
        pd.read_parquet(run / "bundle" / "synthetic.parquet"),
        pd.read_parquet(reference / "bundle" / "synthetic.parquet"),
    )
    assert len(_versions()) == 1
    assert [(e.release_id, e.status) for e in ledger_entries("cardio")] == [(resumed["release_id"], "published")]


def test_two_releases_of_the_same_table_at_once_both_publish_and_both_count(isolated_workdir, demo_csv):
    # No stores yet: the two race to make them (MLflow's schema migrations), as two first releases of a home would.
    (isolated_workdir / "mlflow.db").unlink()
    shutil.rmtree(isolated_workdir / "registry")
    argv = _argv(demo_csv, "--json")
    env = _subprocess_env(isolated_workdir)
    command = [sys.executable, "-m", "dpsynth.flows.cli"] + argv
    started = [
        subprocess.Popen(
            command, cwd=isolated_workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=600) for process in started]
    for process, (_out, err) in zip(started, outputs, strict=False):
        assert process.returncode == 0, err[-3000:]
    ids = sorted(json.loads(out.strip().splitlines()[-1])["release_id"] for out, _ in outputs)
    assert ids[0] != ids[1] and len(_versions()) == 2
    assert sorted((e.release_id, e.status) for e in ledger_entries("cardio")) == [(i, "published") for i in ids]


def test_the_same_command_while_its_run_is_in_progress_is_refused_and_the_first_publishes_untouched(
    isolated_workdir, demo_csv, capfd
):
    """A scheduled release and a steward's rerun of it at once: both find the same run folder. The second is
    refused at once (exit 9) and writes nothing there; the first, paused meanwhile, publishes as usual."""
    argv = _argv(demo_csv, "--json")
    paused, go = isolated_workdir.parent / "paused", isolated_workdir.parent / "go"
    first = subprocess.Popen(
        [sys.executable, "-m", "tests.flows.pause_inside", *argv],
        cwd=isolated_workdir,
        env=_subprocess_env(isolated_workdir, DPSYNTH_TEST_PAUSED=str(paused), DPSYNTH_TEST_GO=str(go)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not paused.exists():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
            time.sleep(0.2)
        (run,) = (isolated_workdir / "runs" / "release").iterdir()
        files = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in run.rglob("*")}
        capfd.readouterr()
        assert main(argv) == 9
        refusal = capfd.readouterr().err
        assert run.name in refusal and f"pid {first.pid}" in refusal and "Traceback" not in refusal
        assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in run.rglob("*")} == files
        assert json.loads((run / "run.json").read_text())["status"] == "running"
        assert not _versions() and ledger_entries("cardio") == []
    finally:
        go.touch()
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["release_id"] == run.name
    assert json.loads((run / "run.json").read_text())["status"] == "published"
    assert len(_versions()) == 1
    assert [(e.release_id, e.status) for e in ledger_entries("cardio")] == [(run.name, "published")]


@pytest.mark.parametrize("generator, failing_file", [("dpcgan", "generator_000040"), ("dpautogan", "release_000030")])
def test_a_dp_sgd_release_stopped_inside_training_resumes_to_the_uninterrupted_result(
    isolated_workdir, demo_csv, capfd, monkeypatch, generator, failing_file
):
    """The other generators resume as GS-WGAN does: the same secret streams replay the updates after the
    last intact checkpoint, so the release equals one that was never stopped, and counts once."""
    real_save = torch.save

    def disk_fills(obj, f, *args, **kwargs):
        if _written(f).name.startswith(failing_file):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(_written(f)))
        return real_save(obj, f, *args, **kwargs)

    argv = _argv(demo_csv, "--generator", generator, "--json")
    monkeypatch.setattr(torch, "save", disk_fills)
    assert main(argv) == 7
    assert "No space left on device" in capfd.readouterr().err
    (run,) = (isolated_workdir / "runs" / "release").iterdir()
    reference = isolated_workdir.parent / "reference"
    shutil.copytree(run, reference)  # the same run (record, secret), trained from scratch
    shutil.rmtree(reference / "train-k10")
    monkeypatch.setattr(torch, "save", real_save)
    assert main(argv) == 0
    resumed = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert main(argv[:-1] + ["--out", str(reference), "--json"]) == 0
    whole = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    for key in ("iteration", "epsilon", "auc", "release_id"):
        assert resumed[key] == whole[key], key
    a = torch.load(run / "bundle" / "generator.pt", weights_only=True)
    b = torch.load(reference / "bundle" / "generator.pt", weights_only=True)
    weights = "state_dict" if generator == "dpcgan" else "generator"
    assert all(torch.equal(a[weights][k], b[weights][k]) for k in a[weights])
    pd.testing.assert_frame_equal(
        pd.read_parquet(run / "bundle" / "synthetic.parquet"),
        pd.read_parquet(reference / "bundle" / "synthetic.parquet"),
    )
    # (The reference is the same release, by id: the ledger holds it once.)
    assert [(e.release_id, e.status) for e in ledger_entries("cardio")] == [(resumed["release_id"], "published")]
