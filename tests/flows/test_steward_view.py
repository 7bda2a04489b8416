"""What a release did to the input, told to the steward and to no one else (issue 40, item 4): a table
with an age of 150 and a missing value releases, and says so on standard error, in `--json`'s internal
fields and in the internal report, never in the bundle; the closing line shows the real rows' AUC beside
the synthetic one; a profile's `input.max_repaired_share` refuses a table that needs more repair, at
validation, before anything starts (no Prefect server either), and the privacy statement lists that
refusal among what epsilon does not cover."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpsynth.flows import prefect_server
from dpsynth.flows.cli import main
from dpsynth.models.config import load_profile
from dpsynth.tasks.decision import statement_for
from dpsynth.tasks.ledger import entries
from tests.conftest import CARDIO_SCHEMA, publishing_smoke


@pytest.fixture
def repaired_csv(tmp_path, demo_frame, cardio_schema):
    """The demo table with one age of 150 years (outside the public bounds) and one missing weight."""
    frame = demo_frame.copy()
    frame["age"] = frame["age"].astype(np.float64)
    frame["weight"] = frame["weight"].astype(np.float64)
    frame.loc[frame.index[5], "age"] = 150 * 365.0
    frame.loc[frame.index[9], "weight"] = np.nan
    path = tmp_path / "repaired.csv"
    frame.to_csv(path, sep=cardio_schema.separator, index=False)
    return path


def test_a_release_tells_the_steward_what_it_repaired_and_publishes_none_of_it(
    isolated_workdir, repaired_csv, capfd, tmp_path
):
    profile = publishing_smoke(tmp_path / "profiles")
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(repaired_csv), "--profile", profile, "--json"]
    assert main(argv) == 0
    captured = capfd.readouterr()
    repaired = [line for line in captured.err.splitlines() if "needed repair" in line]
    assert len(repaired) == 1, captured.err
    assert "'age' 1 value outside its public bounds" in repaired[0] and "'weight' 1 value missing" in repaired[0]
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["input_repairs"] == {
        "age": {"outside_bounds": 1, "missing": 0, "imputed": 1},
        "weight": {"outside_bounds": 0, "missing": 1, "imputed": 1},
    }
    # The closing line: the synthetic rows' AUC beside the real rows' own (both internal).
    assert (
        captured.out.strip()
        .splitlines()[-2]
        .endswith(f"AUC {summary['auc']:.3f} (real rows {summary['real_auc']:.3f}; internal)")
    )
    report = (isolated_workdir / summary["report"]).read_text()
    assert "What the release did to the input" in report
    # Internal only: nothing of it in the bundle.
    bundle = isolated_workdir / summary["bundle_dir"]
    for path in (p for p in bundle.rglob("*") if p.is_file() and p.suffix != ".pt"):
        text = path.read_text(errors="ignore")
        assert "input_repairs" not in text and "needed repair" not in text and "outside_bounds" not in text


def test_max_repaired_share_refuses_at_validation_before_any_server_or_run(
    isolated_workdir, repaired_csv, capfd, tmp_path, monkeypatch
):
    def no_server(self):
        raise AssertionError("a refused release started a Prefect server")

    monkeypatch.setattr(prefect_server.TemporaryServer, "start", no_server)
    profile = publishing_smoke(tmp_path / "profiles", input={"max_repaired_share": 0.0001})
    argv = ["release", "--config", str(CARDIO_SCHEMA), "--data", str(repaired_csv), "--profile", profile]
    assert main(argv) == 4
    err = capfd.readouterr().err
    assert "input.max_repaired_share 0.0001" in err and "column 'age'" in err and "Traceback" not in err
    assert not (isolated_workdir / "runs").exists() and entries("cardio") == []
    # Depending on the rows, the refusal is named where the statement lists what epsilon does not cover.
    prof = load_profile(profile, CARDIO_SCHEMA)
    statement = statement_for(prof, prof.release_target(), release=True)
    assert any("input.max_repaired_share" in item for item in statement.does_not_cover)
    # Without the key, the statement is as before.
    plain = load_profile(publishing_smoke(tmp_path / "plain"), CARDIO_SCHEMA)
    plain_statement = statement_for(plain, plain.release_target(), release=True)
    assert not any("max_repaired_share" in item for item in plain_statement.does_not_cover)
