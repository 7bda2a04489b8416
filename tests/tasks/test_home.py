"""One home per installation: the ledger, the stores and the run folders do not follow the working folder."""

import json

from dpsynth.flows.cli import main
from dpsynth.models.privacy.lifetime import ReleaseCost, TrainingCurve
from dpsynth.tasks import ledger
from dpsynth.tasks.home import home
from dpsynth.tasks.tracking import tracking_uri
from tests.conftest import CARDIO_SCHEMA

COST = ReleaseCost(4.0, 1e-5, TrainingCurve(1000, 5000, 32, 1.07, "per_row"), 1.0, True)


def _ledger_json(capsys, *extra) -> dict:
    assert main([*extra, "ledger", "--config", str(CARDIO_SCHEMA), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_two_working_folders_with_one_home_see_one_ledger(tmp_path, monkeypatch, capsys, private_home):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    ledger.enter("cardio", "r1", COST, budget=None)
    monkeypatch.chdir(second)
    report = _ledger_json(capsys)
    assert [r["release_id"] for r in report["releases"]] == ["r1"]
    assert report["ledger"] == str(private_home / "privacy-ledger.sqlite")
    assert tracking_uri() == f"sqlite:///{private_home / 'mlflow.db'}"
    assert not any(p.name.endswith((".sqlite", ".db")) for p in [*first.iterdir(), *second.iterdir()])


def test_the_home_option_names_another_home(tmp_path, monkeypatch, capsys, private_home):
    ledger.enter("cardio", "r1", COST, budget=None)
    other = tmp_path / "other-home"
    assert _ledger_json(capsys, "--home", str(other))["releases"] == []
    assert other.stat().st_mode & 0o777 == 0o700


def test_the_default_home_is_owner_only_under_the_users_home(tmp_path, monkeypatch):
    monkeypatch.delenv("DPSYNTH_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert home() == tmp_path / ".dpsynth" and home().stat().st_mode & 0o777 == 0o700
    assert ledger.ledger_path() == tmp_path / ".dpsynth" / "privacy-ledger.sqlite"


def test_a_remote_tracking_store_needs_an_explicit_home(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DPSYNTH_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    assert main(["ledger", "--config", str(CARDIO_SCHEMA)]) == 2
    err = capsys.readouterr().err
    assert "DPSYNTH_HOME" in err and "--home" in err and "Traceback" not in err
    assert not (tmp_path / ".dpsynth").exists()
    monkeypatch.setenv("DPSYNTH_HOME", str(tmp_path / "named"))
    assert main(["ledger", "--config", str(CARDIO_SCHEMA)]) == 0
