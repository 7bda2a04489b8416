"""The command line: JSON on the last line, readable errors and exit codes, never a traceback."""

import json
import subprocess
import sys

import pytest
import yaml

from dpsynth.flows.cli import main
from dpsynth.models.errors import ConfigError
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
    assert main([*args[:-1], "heaped"]) != 0  # two narrow columns but no wider one
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--shape heaped needs two continuous columns" in err
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
        "source": "shipped",
        "tuned_for": "cardio",
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
    table = table[:-1]  # the closing sentence on where names are looked up
    assert table[0].split() == [
        "name",
        "source",
        "tuned",
        "for",
        "generator",
        "epsilon",
        "budget",
        "lifetime",
        "budget",
        "trial",
        "release",
    ]
    assert len(table) == 1 + len(shipped)
    smoke_row = [line.split()[:5] for line in table if line.split()[0] == "smoke"]
    assert smoke_row == [["smoke", "shipped", "any", "schema", "gswgan"]]
    assert any(line.split()[:7] == ["default", "shipped", "cardio", "gswgan", "10", "30", "no"] for line in table)


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
        assert f"shipped with dpsynth: {', '.join(known)} (" in err and "smoke" in known, err
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
    assert "release   7: refused: privacy.lifetime_budget" in out
    # Without --profile, on a table without releases: what to pass, and no ledger printed before it.
    assert main(["ledger", "--config", str(CARDIO_SCHEMA), "--forecast", "3"]) == 2
    captured = capsys.readouterr()
    assert "pass --profile" in captured.err and captured.out == ""


# ------------------------------------------------------------------ a steward's own table (issue 40)


@pytest.fixture
def own_folder(tmp_path, monkeypatch):
    """A steward's folder outside the checkout: `my/schema.yaml` (Cardio's schema, copied), no profiles."""
    folder = tmp_path / "steward"
    (folder / "my").mkdir(parents=True)
    (folder / "my" / "schema.yaml").write_text(CARDIO_SCHEMA.read_text())
    monkeypatch.chdir(folder)
    return folder


def test_shipped_profiles_resolve_for_a_schema_outside_the_checkout(own_folder, demo_csv, capsys):
    """Before, a profile name resolved only in `profiles/` beside the schema: exit 2 for `--profile smoke`."""
    schema = "my/schema.yaml"
    for profile in ("smoke", "mst-eps1", "eps1"):
        assert main(["epsilon", "--config", schema, "--profile", profile, "--json"]) == 0, capsys.readouterr().err
        assert last_json(capsys)["profile"] == profile
    # A release reads the shipped profile and goes on to the table (exit 4: the table does not conform).
    (own_folder / "bad.csv").write_text("a;b\n1;2\n")
    argv = ["release", "--config", schema, "--data", "bad.csv", "--profile", "smoke", "--out", "run"]
    assert main(argv) == 4
    err = capsys.readouterr().err
    assert "does not conform to the schema" in err and "Profile" not in err and "Traceback" not in err
    # A steward's own profile may extend a shipped one, and one of its own wins over a shipped name.
    (own_folder / "my" / "profiles").mkdir()
    (own_folder / "my" / "profiles" / "mine.yaml").write_text("extends: mst-eps1\nprivacy: {lifetime_budget: 4.0}\n")
    (own_folder / "my" / "profiles" / "smoke.yaml").write_text("extends: mst-eps1\n")
    assert main(["profiles", "--config", schema, "--json"]) == 0
    rows = last_json(capsys)["profiles"]
    assert [(r["name"], r["source"]) for r in rows[:2]] == [("mine", "own"), ("smoke", "own")]
    assert [r["name"] for r in rows if r["source"] == "shipped"] == [
        n for n in sorted(p.stem for p in (CARDIO_SCHEMA.parent / "profiles").glob("*.yaml")) if n != "smoke"
    ]
    mine = rows[0]
    assert mine["generator"] == "mst" and mine["lifetime_budget"] == 4.0 and mine["tuned_for"] is None


def test_profiles_outside_the_checkout_lists_the_shipped_ones_and_what_each_is_tuned_for(own_folder, capsys):
    """Before: 0 profiles, exit 0, outside the checkout."""
    assert main(["profiles", "--json"]) == 0
    result = last_json(capsys)
    rows = {r["name"]: r for r in result["profiles"]}
    assert set(rows) == {p.stem for p in (CARDIO_SCHEMA.parent / "profiles").glob("*.yaml")}
    assert {r["source"] for r in rows.values()} == {"shipped"} and result["folder"] is None
    tuned = {name: r["tuned_for"] for name, r in rows.items() if r["tuned_for"]}
    assert tuned == {"default": "cardio", "thesis": "cardio", "thesis-k1500": "cardio", "census-eps3": "census_demo"}
    for generic in ("smoke", "eps1", "eps3", "mst-eps1", "aim-eps1"):
        assert rows[generic]["tuned_for"] is None


def test_an_unknown_profile_outside_the_checkout_lists_the_shipped_ones(own_folder, demo_frame, capsys):
    import dpsynth

    shipped = ", ".join(sorted(p.stem for p in (CARDIO_SCHEMA.parent / "profiles").glob("*.yaml")))
    assert main(["epsilon", "--config", "my/schema.yaml", "--profile", "msteps1"]) == 2
    err = capsys.readouterr().err
    assert f"shipped with dpsynth: {shipped} (" in err and "Traceback" not in err
    # The API: before, it pointed at <home>/inputs/profiles/ and said "none".
    with pytest.raises(ConfigError) as refused:
        dpsynth.release(demo_frame, dpsynth.Schema.from_yaml(CARDIO_SCHEMA).with_target("cardio"), profile="msteps1")
    assert f"shipped with dpsynth: {shipped} (" in str(refused.value) and "none" not in str(refused.value)


def test_demo_data_without_a_schema_outside_the_checkout_says_to_pass_config(own_folder, capsys):
    assert main(["demo-data", "--rows", "10", "--out", "demo.csv"]) == 2
    err = capsys.readouterr().err
    assert "pass --config SCHEMA.yaml" in err and "Traceback" not in err
    assert not (own_folder / "demo.csv").exists()
    assert main(["demo-data", "--rows", "10", "--out", "demo.csv", "--config", "my/schema.yaml"]) == 0


def test_the_command_line_and_the_api_default_to_the_same_generic_profile():
    """Before: `dpsynth release` took `default` (GS-WGAN tuned on Cardio, epsilon 10, ~25 minutes) and the
    API `eps1`."""
    import inspect

    import dpsynth
    from dpsynth.flows.cli import build_parser
    from dpsynth.models.config import profile_tuned_for
    from dpsynth.models.profiles import profile_files

    args = build_parser().parse_args(["release", "--config", "s.yaml", "--data", "t.csv"])
    assert args.profile == inspect.signature(dpsynth.release).parameters["profile"].default == "eps1"
    (shipped,) = [f for f in profile_files(None) if f.name == args.profile]
    assert profile_tuned_for(shipped.path) is None


def write_csv(path, rows):
    path.write_text("\n".join(";".join(str(v) for v in row) for row in rows) + "\n")
    return path


def test_schema_draft_from_the_shell_marks_every_value_to_fill_and_reads_no_value(own_folder, capsys):
    header = ["id", "age", "score", "sex", "cured"]
    rows = [header] + [[i, 20 + i % 50, round(i / 7, 1), "mf"[i % 2], i % 2] for i in range(60)]
    table = write_csv(own_folder / "t.csv", rows)
    assert main(["schema", "draft", str(table), "--out", "s.yaml", "--target", "cured", "--id-column", "id"]) == 0
    text = (own_folder / "s.yaml").read_text()
    spec = yaml.safe_load(text)
    assert spec["separator"] == ";" and spec["target"] == "cured" and spec["id_column"] == "id"
    assert {c: e["type"] for c, e in spec["columns"].items()} == {
        "age": "continuous",
        "score": "continuous",
        "sex": "categorical",
        "cured": "binary",
    }
    assert spec["columns"]["score"]["decimals"].startswith("fill from public knowledge")  # before: unset
    assert "make it `type: categorical`" in text  # the comment above a numeric column that may hold codes
    for value in ("69", "8.4", "'m'", "[0, 1]"):
        assert value not in text
    # The same draft from a table that differs in one row (a new level, a text value in no numeric column).
    other = write_csv(own_folder / "u.csv", rows[:-1] + [[59, 150, 99.5, "x", 1]])
    assert main(["schema", "draft", str(other), "--out", "s2.yaml", "--target", "cured", "--id-column", "id"]) == 0
    assert (own_folder / "s2.yaml").read_text() == text.replace("name: t\n", "name: u\n")
    # An existing file is not overwritten.
    assert main(["schema", "draft", str(table), "--out", "s.yaml"]) == 2
    assert "--force" in capsys.readouterr().err

    # check: what is missing, exit 2 while anything is; complete, exit 0.
    assert main(["schema", "check", "s.yaml", "--json"]) == 2
    captured = capsys.readouterr()
    assert last_json_of(captured.out)["missing"] == [
        "column 'age': bounds",
        "column 'age': decimals",
        "column 'score': bounds",
        "column 'score': decimals",
        "column 'sex': levels",
        "column 'cured': levels",
    ]
    assert "still lacks 6 value(s)" in captured.err and "Traceback" not in captured.err
    spec["columns"]["age"].update(bounds=[18, 100], decimals=0)
    spec["columns"]["score"].update(bounds=[0, 10], decimals=1)
    spec["columns"]["sex"]["levels"] = ["m", "f"]
    spec["columns"]["cured"]["levels"] = [0, 1]
    (own_folder / "s.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["schema", "check", "s.yaml"]) == 0
    assert "is complete" in capsys.readouterr().out
    assert main(["validate", "--config", "s.yaml", "--data", str(table)]) == 0
    spec["columns"]["sex"]["levels"] = ["m"]  # a rule broken: the schema's own message, exit 2
    (own_folder / "s.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["schema", "check", "s.yaml"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def last_json_of(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_the_forecast_applies_planned_releases_and_the_refusals_already_counted(own_folder, capsys):
    """Issue 40: after 2 releases of a profile that plans 6, `--forecast 5` said every one fits, and the
    5th (the 7th release) was refused on privacy.planned_releases. A release the DP approval refused is
    counted as release counts it; without --profile the forecast takes the last release's profile."""
    from dpsynth.models.profiles import load_named
    from dpsynth.tasks import ledger
    from dpsynth.tasks.decision import planned_release_cost

    (own_folder / "my" / "profiles").mkdir()
    (own_folder / "my" / "profiles" / "monthly.yaml").write_text("extends: mst-eps1\nprivacy: {planned_releases: 6}\n")
    profile = load_named("monthly", "my/schema.yaml")
    cost = planned_release_cost(profile, profile.release_target())
    ledger.enter("cardio", "r1", cost, 30.0, status="published", profile="monthly")
    ledger.enter("cardio", "r2", cost, 30.0, status="refused", profile="monthly")
    for argv in (["--profile", "monthly"], []):  # the last release's profile when none is named
        assert main(["ledger", "--config", "my/schema.yaml", "--forecast", "5", "--json", *argv]) == 0
        out = capsys.readouterr().out
        forecast = last_json_of(out)["forecast"]
        assert forecast["profile"] == "monthly"
        assert [v["fits"] for v in forecast["verdicts"]] == [True, True, True, True, False]
        assert forecast["verdicts"][4]["rule"] == "privacy.planned_releases" and forecast["stops_at"] == 5
        assert "release   5: refused: privacy.planned_releases" in out and "every one fits" not in out
    # The same profile-level refusal release makes (no lifetime budget) is the forecast's too.
    (own_folder / "my" / "profiles" / "unbounded.yaml").write_text(
        "extends: mst-eps1\nprivacy: {lifetime_budget: null}\n"
    )
    assert main(["ledger", "--config", "my/schema.yaml", "--forecast", "2", "--profile", "unbounded"]) == 0
    assert "every release of profile 'unbounded' would be refused before any work" in capsys.readouterr().out
