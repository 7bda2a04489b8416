"""The command line: JSON on the last line, readable errors and exit codes, never a traceback."""

import json
import subprocess
import sys

import pytest

from flows.cli import main
from tests.conftest import CARDIO_SCHEMA, ROOT


def last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_epsilon_command_matches_reference(capsys):
    assert main(["epsilon", "--discriminators", "1000", "--iterations", "20000", "--batch-size", "32",
                 "--noise-multiplier", "1.07", "--delta", "1e-5", "--json"]) == 0
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


def test_validate_bad_table_is_readable_in_a_real_process(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("age;gender\n1;2\n")
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "validate", "--config", str(CARDIO_SCHEMA),
                           "--data", str(bad)], capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "missing" in proc.stderr.lower()


@pytest.mark.parametrize("args, fragment", [
    (["--profile", "nope"], "does not exist"),
    (["--data", "/no/such/file.csv"], "does not exist"),
])
def test_release_bad_input_fails_before_any_flow(tmp_path, demo_csv, capsys, args, fragment):
    base = {"--config": str(CARDIO_SCHEMA), "--data": str(demo_csv), "--profile": "smoke",
            "--out": str(tmp_path / "run")}
    for key, value in zip(args[::2], args[1::2]):
        base[key] = value
    argv = ["release"] + [x for kv in base.items() for x in kv]
    assert main(argv) != 0
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "run" / "validate").exists()
