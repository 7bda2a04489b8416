"""The command line: JSON on the last line, readable errors and exit codes, never a traceback."""

import json
import subprocess
import sys

import pytest

from dpsynth.flows.cli import main
from tests.conftest import CARDIO_SCHEMA, ROOT


def last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_epsilon_command_matches_reference(capsys):
    assert (
        main(
            [
                "epsilon",
                "--discriminators",
                "1000",
                "--iterations",
                "20000",
                "--batch-size",
                "32",
                "--noise-multiplier",
                "1.07",
                "--delta",
                "1e-5",
                "--json",
            ]
        )
        == 0
    )
    assert abs(last_json(capsys)["epsilon"] - 9.99) / 9.99 < 0.01


def test_epsilon_bad_arguments_exit_nonzero(capsys):
    assert main(["epsilon", "--discriminators", "0", "--iterations", "10", "--json"]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "discriminators" in err.lower()


def test_demo_data_then_validate(tmp_path, capsys):
    out = tmp_path / "demo.csv"
    assert main(["demo-data", "--rows", "500", "--out", str(out), "--config", str(CARDIO_SCHEMA)]) == 0
    assert main(["validate", "--config", str(CARDIO_SCHEMA), "--data", str(out), "--json"]) == 0
    assert last_json(capsys)["passed"] is True


def test_demo_data_shape_the_schema_cannot_take_is_a_readable_error(tmp_path, capsys):
    schema = tmp_path / "two.yaml"
    schema.write_text(
        "name: two\ntarget: label\ncolumns:\n"
        "  a: {type: continuous, bounds: [0, 10], decimals: 0}\n"
        "  b: {type: continuous, bounds: [0, 10], decimals: 0}\n"
        "  kind: {type: categorical, levels: [x, y, z]}\n"
        "  label: {type: binary, levels: [neg, pos]}\n"
    )
    out = tmp_path / "demo.csv"
    args = ["demo-data", "--rows", "50", "--out", str(out), "--config", str(schema), "--shape", "measured"]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--shape measured needs three continuous columns" in err
    assert not out.exists()


def test_validate_bad_table_is_readable_in_a_real_process(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("age;gender\n1;2\n")
    proc = subprocess.run(
        [sys.executable, "-m", "dpsynth.flows.cli", "validate", "--config", str(CARDIO_SCHEMA), "--data", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "missing" in proc.stderr.lower()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--profile", "nope"], "does not exist"),
        (["--data", "/no/such/file.csv"], "does not exist"),
    ],
)
def test_release_bad_input_fails_before_any_flow(tmp_path, demo_csv, capsys, args, fragment):
    base = {
        "--config": str(CARDIO_SCHEMA),
        "--data": str(demo_csv),
        "--profile": "smoke",
        "--out": str(tmp_path / "run"),
    }
    for key, value in zip(args[::2], args[1::2], strict=False):
        base[key] = value
    argv = ["release"] + [x for kv in base.items() for x in kv]
    assert main(argv) != 0
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "run" / "validate").exists()


def test_version_comes_from_the_installed_package(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"dpsynth {version('dpsynth')}"


def test_every_argument_of_every_command_has_help():
    import argparse

    from dpsynth.flows.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    described = {a.dest for a in commands._choices_actions if a.help}
    assert described == set(commands.choices), "a command without help"
    missing = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, sub in [("dpsynth", parser), *commands.choices.items()]
        for action in sub._actions
        if not isinstance(action, argparse._SubParsersAction) and action.help in (None, "", argparse.SUPPRESS)
    ]
    assert missing == []


def test_profiles_lists_the_shipped_profiles(capsys):
    assert main(["profiles", "--config", str(CARDIO_SCHEMA), "--json"]) == 0
    out = capsys.readouterr().out
    listed = {row["name"]: row for row in json.loads(out.strip().splitlines()[-1])["profiles"]}
    shipped = {path.stem for path in (CARDIO_SCHEMA.parent / "profiles").glob("*.yaml")}
    assert set(listed) == shipped and "smoke" in shipped
    assert listed["smoke"]["trial"] is True and listed["smoke"]["release"] == "trial: publishes nothing"
    assert listed["default"] == {
        "name": "default",
        "generator": "gswgan",
        "epsilon_budget": 10.0,
        "lifetime_budget": 30.0,
        "trial": False,
        "release": "publishes",
    }
    assert listed["eps3"]["generator"] == "dpautogan" and listed["eps3"]["epsilon_budget"] == 3.0
    assert listed["thesis"]["release"].startswith("experiment only")
    # Every shipped profile that `release` publishes with names a lifetime budget; one that names none
    # (an experiment profile) is refused as a release.
    for row in listed.values():
        assert row["release"] in ("publishes", "trial: publishes nothing") or row["release"].startswith(
            ("experiment only", "refused (no lifetime budget")
        ), row
        assert (row["release"] == "publishes") == (
            not row["trial"] and row["lifetime_budget"] is not None and not row["release"].startswith("experiment")
        ), row
    for name in ("default", "eps1", "eps3", "census-eps3", "mst-eps1", "thesis-k1500"):
        assert listed[name]["release"] == "publishes" and listed[name]["lifetime_budget"] == 30.0, name
    # The table: a header and a line per profile, with its name and budgets.
    table = out.strip().splitlines()[1:-1]
    assert table[0].split() == ["name", "generator", "epsilon", "budget", "lifetime", "budget", "trial", "release"]
    assert len(table) == 1 + len(shipped)
    assert [line.split()[:2] for line in table if line.split()[0] == "smoke"] == [["smoke", "gswgan"]]
    assert any(line.split()[:5] == ["default", "gswgan", "10", "30", "no"] for line in table)


def test_an_unknown_profile_name_lists_the_known_ones(tmp_path, demo_csv, capsys):
    for argv in (
        [
            "release",
            "--config",
            str(CARDIO_SCHEMA),
            "--data",
            str(demo_csv),
            "--profile",
            "smoek",
            "--out",
            str(tmp_path / "run"),
        ],
        ["epsilon", "--config", str(CARDIO_SCHEMA), "--profile", "smoek"],
        ["ledger", "--config", str(CARDIO_SCHEMA), "--profile", "smoek"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "'smoek' does not exist" in err and "Traceback" not in err
        known = sorted(path.stem for path in (CARDIO_SCHEMA.parent / "profiles").glob("*.yaml"))
        assert f"Profiles beside the schema: {', '.join(known)} (" in err and "smoke" in known, err
    assert not (tmp_path / "run").exists()


def test_a_release_closing_line_names_uri_bundle_and_epsilon_and_warns_above_10():
    from dpsynth.flows.cli import closing_lines

    summary = {
        "release_id": "cardio-default-0123456789ab",
        "epsilon": 9.994,
        "delta": 1e-5,
        "auc": 0.7912,
        "published": True,
        "trial": False,
        "model_uri": "models:/cardio-gswgan/3",
        "bundle_dir": "runs/release/cardio-default-0123456789ab/bundle",
        "report": "r.html",
    }
    line, warnings = closing_lines(summary)
    assert line == (
        "release cardio-default-0123456789ab: published models:/cardio-gswgan/3 at epsilon 9.99 "
        "(delta 1e-05), bundle runs/release/cardio-default-0123456789ab/bundle; AUC 0.791"
    )
    assert warnings == []
    # Beside it the real rows' own AUC, when the summary has it (internal, as the AUC itself).
    assert closing_lines({**summary, "real_auc": 0.8034})[0].endswith("; AUC 0.791 (real rows 0.803; internal)")
    assert closing_lines({**summary, "epsilon": 10.0})[1] == []
    for epsilon, shown in ((10.004, "10.00"), (71.405, "71.41"), (None, "inf (not private)")):
        line, warnings = closing_lines({**summary, "epsilon": epsilon})
        assert f"at epsilon {shown} " in line
        assert len(warnings) == 1 and f"epsilon is {shown}, above 10" in warnings[0]
    line, warnings = closing_lines({**summary, "published": False, "trial": True, "epsilon": 71.405})
    assert line.startswith("trial cardio-default-0123456789ab: nothing published") and warnings == []
    assert "models:/" not in line and "bundle runs" not in line and "epsilon 71.41" in line


def test_ledger_forecast_says_which_release_the_lifetime_budget_stops(tmp_path, monkeypatch, capsys):
    """The monthly `default` release (epsilon 9.99 each, lifetime budget 30) on an empty ledger: the
    ledger's own composition fits six, and the seventh would be refused."""
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.sqlite"))
    args = ["ledger", "--config", str(CARDIO_SCHEMA), "--profile", "default", "--forecast", "12", "--json"]
    assert main(args) == 0
    out = capsys.readouterr().out
    forecast = json.loads(out.strip().splitlines()[-1])["forecast"]
    assert len(forecast["after"]) == 12 and forecast["lifetime_budget"] == 30.0
    stops = forecast["stops_at"]
    assert stops == 7 and 25.0 < forecast["after"][5] <= 30.0
    assert forecast["after"][6:] == [forecast["after"][5]] * 6  # refused releases spend nothing
    assert f"release {stops} and every one after it would be refused" in out
    assert main(["ledger", "--config", str(CARDIO_SCHEMA), "--forecast", "3"]) == 2
    assert "--profile" in capsys.readouterr().err
