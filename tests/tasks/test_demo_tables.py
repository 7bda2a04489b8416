"""A demo table is one `dpsynth demo-data` wrote and nobody changed since: its sidecar
(`<table>.demo.json`) holds the table's sha256 and the generator's parameters, and a trial on any other
table says it reads a real one."""

import json
import shutil

from dpsynth.flows.cli import main
from dpsynth.tasks.context import demo_sidecar, is_demo_table
from dpsynth.tasks.stage import sha256_file
from tests.conftest import CARDIO_SCHEMA


def test_demo_data_writes_a_sidecar_that_names_the_table_hash(tmp_path, capsys):
    table = tmp_path / "demo.csv"
    assert (
        main(
            [
                "demo-data",
                "--rows",
                "200",
                "--seed",
                "4",
                "--shape",
                "hard",
                "--out",
                str(table),
                "--config",
                str(CARDIO_SCHEMA),
            ]
        )
        == 0
    )
    assert "demo.csv.demo.json" in capsys.readouterr().out
    sidecar = json.loads((tmp_path / "demo.csv.demo.json").read_text())
    assert sidecar["sha256"] == sha256_file(table)
    parameters = sidecar["parameters"]
    assert isinstance(parameters.pop("schema_version"), int)
    assert parameters == {"schema": "cardio", "rows": 200, "seed": 4, "shape": "hard"}
    assert is_demo_table(table, sha256_file(table))


def test_only_an_unchanged_table_with_its_sidecar_is_a_demo_table(tmp_path, demo_csv):
    assert not is_demo_table(demo_csv, sha256_file(demo_csv))  # generated, but no sidecar: real to dpsynth
    table = tmp_path / "made.csv"
    assert main(["demo-data", "--rows", "100", "--out", str(table), "--config", str(CARDIO_SCHEMA)]) == 0
    # The sidecar beside another table does not make it a demo table.
    shutil.copy(demo_sidecar(table), demo_sidecar(demo_csv))
    assert not is_demo_table(demo_csv, sha256_file(demo_csv))
    # A demo table edited (or replaced by real rows) after it was written is no longer one.
    with table.open("a") as handle:
        handle.write(table.read_text().splitlines()[1] + "\n")
    assert not is_demo_table(table, sha256_file(table))
    # A damaged or foreign sidecar is not a demo marker.
    for text in ("{not json", "[]", json.dumps({"sha": sha256_file(table)})):
        demo_sidecar(table).write_text(text)
        assert not is_demo_table(table, sha256_file(table)), text
    demo_sidecar(table).write_text(json.dumps({"sha256": sha256_file(table)}))
    assert is_demo_table(table, sha256_file(table))
