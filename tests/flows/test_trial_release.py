"""Trials publish nothing: `--profile smoke` (a `trial: true` profile) and `release --no-publish` run
every stage and register nothing, write no bundle, move no alias and enter nothing in the privacy ledger;
a trial on a table `dpsynth demo-data` did not write says so on standard error. Only a profile with a
lifetime budget publishes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dpsynth.flows.cli import main
from dpsynth.models.config import load_profile
from dpsynth.models.errors import ConfigError
from dpsynth.tasks.context import REAL_TABLE_TRIAL
from dpsynth.tasks.ledger import entries as ledger_entries
from tests.conftest import CARDIO_SCHEMA, publishing_smoke

REAL_TABLE_LINE = f"dpsynth release: {REAL_TABLE_TRIAL}"


def _trial_line(summary: dict) -> str:
    return (
        f"trial {summary['release_id']}: nothing published (nothing registered, no bundle, no alias moved, "
        f"nothing entered in the privacy ledger); a release would have spent epsilon {summary['epsilon']:.2f} "
        f"at delta 1e-05; AUC {summary['auc']:.3f} (real rows {summary['real_auc']:.3f}; internal); internal "
        f"report {summary['report']}"
    )


def _published_nothing(workdir: Path, summary: dict) -> None:
    out = workdir / summary["run_dir"]
    assert summary["published"] is False and summary["trial"] is True
    assert not {"model_uri", "model_version", "bundle_dir"} & set(summary)
    # Every stage ran, up to the DP choice and the internal report.
    for stage in (
        "validate",
        "split",
        "preprocess",
        "pretrain-k10",
        "train-k10",
        "sample-k10",
        "evaluate-k10/000",
        "evaluate-real/000",
        "report",
    ):
        assert (out / stage / "manifest.json").exists(), stage
    assert json.loads((out / "decision.json").read_text())["iteration"] == summary["iteration"]
    assert (out / "report" / "report.html").exists()
    assert not (out / "bundle").exists() and not (out / "release").exists()
    assert json.loads((out / "run.json").read_text())["status"] == "trial"
    # Nothing registered, no alias anywhere: no registry store was even made, and the internal one has none.
    assert not (workdir / "registry").exists() and MlflowClient().search_registered_models() == []
    assert ledger_entries("cardio") == []


def test_the_sessions_smoke_trial_ran_every_stage_and_published_nothing(smoke_trial, in_smoke_trial):
    # The command as a user runs it, in its own process (tests/flows/conftest.py): the fast tier's one release.
    assert smoke_trial.stderr == ""  # a demo table: no word about a real one; nothing published: no warning
    assert smoke_trial.stdout[-2] == _trial_line(smoke_trial.summary)
    _published_nothing(in_smoke_trial, smoke_trial.summary)
    assert smoke_trial.summary["epsilon"] > 10  # what smoke would have cost: why it is a trial
    assert not (in_smoke_trial / "privacy-ledger.sqlite").exists()


@pytest.fixture
def trial_workdir(isolated_workdir) -> Path:
    """`isolated_workdir` without its registry store: a trial must not even make one (`_published_nothing`)."""
    shutil.rmtree(isolated_workdir / "registry")
    return isolated_workdir


def test_a_smoke_trial_on_a_demo_table_publishes_nothing_and_a_second_one_runs_too(smoke_trial, trial_workdir, capfd):
    """The first trial is the session's (`smoke_trial`: `dpsynth demo-data`, then the same command as below, in a
    process of its own); its home's table and run folders are copied into this test's home (its folder stays
    untouched) and the same command runs there again, in this process. A second identical smoke trial per session
    cost a whole release (about 17 CPU seconds) and showed nothing the session's did not."""
    for name in ("demo.csv", "demo.csv.demo.json", "runs"):
        source = smoke_trial.workdir / name
        if source.is_dir():
            shutil.copytree(source, trial_workdir / name)
        else:
            shutil.copy2(source, trial_workdir / name)
    table = trial_workdir / "demo.csv"
    assert (trial_workdir / "demo.csv.demo.json").exists()
    first = smoke_trial.summary
    assert smoke_trial.stderr == ""  # a demo table: no word about a real one; nothing published: no warning
    assert smoke_trial.stdout[-2] == _trial_line(first)
    assert first["epsilon"] > 10  # what smoke would have cost: why it is a trial
    first_run = trial_workdir / Path(first["run_dir"]).relative_to(smoke_trial.workdir)  # its copy
    _published_nothing(trial_workdir, {**first, "run_dir": str(first_run)})
    assert not (trial_workdir / "privacy-ledger.sqlite").exists()
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(table), "--profile", "smoke", "--json"]

    # The same command after a finished trial: a new run (new id, new secret), and again nothing published.
    capfd.readouterr()
    assert main(argv) == 0
    captured = capfd.readouterr()
    lines = captured.out.strip().splitlines()
    second = json.loads(lines[-1])
    assert captured.err == "" and second["release_id"] != first["release_id"]
    assert lines[-2] == _trial_line(second)
    _published_nothing(trial_workdir, second)
    assert not (trial_workdir / "privacy-ledger.sqlite").exists()
    assert len(list((trial_workdir / "runs" / "release").iterdir())) == 2

    # The trial's folder named with --out again: reused, nothing new.
    assert main(argv + ["--out", str(first_run)]) == 0
    reused = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert reused["reused"] is True and reused["release_id"] == first["release_id"] and reused["published"] is False


def test_no_publish_makes_a_publishing_release_a_trial_that_says_so_on_a_real_table(
    trial_workdir, demo_csv, capfd, tmp_path
):
    # A publishing profile whose lifetime budget (1) is below smoke's epsilon (71.4): as a release it is
    # refused before any work; as a trial it enters nothing, so it checks nothing against the ledger.
    profile = publishing_smoke(tmp_path / "profiles", privacy={"lifetime_budget": 1.0})
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(demo_csv), "--profile", profile, "--json"]
    assert main(argv) == 5
    assert "lifetime_budget" in capfd.readouterr().err and not (trial_workdir / "runs").exists()

    assert main(argv + ["--no-publish"]) == 0
    captured = capfd.readouterr()
    # demo_csv is generated, but not by `dpsynth demo-data` (no sidecar): a real table as far as dpsynth knows.
    assert captured.err.splitlines() == [REAL_TABLE_LINE]
    lines = captured.out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert lines[-2] == _trial_line(summary)
    _published_nothing(trial_workdir, summary)
    # --no-publish is part of the run's identity: the trial's folder is never resumed by a release.
    from dpsynth.tasks.context import load_context

    record = json.loads((trial_workdir / summary["run_dir"] / "run.json").read_text())
    as_release = load_context(str(CARDIO_SCHEMA), str(demo_csv), profile, None, "release")
    assert not as_release.profile.trial and record["identity"] != as_release.identity
    assert as_release.run_id != summary["release_id"]


def test_a_publishing_profile_without_a_lifetime_budget_is_refused_before_any_work(
    trial_workdir, demo_csv, capfd, tmp_path
):
    profile = publishing_smoke(tmp_path / "profiles", privacy={"lifetime_budget": None})
    out = trial_workdir / "run"
    assert (
        main(
            [
                "release",
                "--config",
                str(CARDIO_SCHEMA),
                "--data",
                str(demo_csv),
                "--profile",
                profile,
                "--out",
                str(out),
            ]
        )
        == 2
    )
    err = capfd.readouterr().err
    assert "privacy.lifetime_budget" in err and "--no-publish" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1  # one paragraph
    assert not out.exists() and not (trial_workdir / "runs").exists()
    assert not (trial_workdir / "privacy-ledger.sqlite").exists()

    # A deployment enters at the flow: refused there too, before the run folder exists.
    from dpsynth.flows.release import release

    with pytest.raises(ConfigError, match="privacy.lifetime_budget"):
        release(config=str(CARDIO_SCHEMA), data=str(demo_csv), profile=profile, out=str(out))
    assert not out.exists()


@pytest.mark.parametrize(
    "value, message",
    [
        ("yes", r"p.yaml\): trial: expected true or false \(got 'yes'\)"),
        (1, r"p.yaml\): trial: expected true or false \(got 1\)"),
    ],
    ids=["text", "number"],
)
def test_trial_is_validated_like_every_key(tmp_path, value, message):
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "p.yaml").write_text(json.dumps({"trial": value}))
    with pytest.raises(ConfigError, match=message):
        load_profile("p", tmp_path / "schema.yaml")
    (folder / "q.yaml").write_text("{}")
    assert load_profile("q", tmp_path / "schema.yaml").trial is False
    assert load_profile("smoke", CARDIO_SCHEMA).trial is True
