"""The preflight's validation of a table is not run again by the validate stage of the same process (the
same bytes, schema and row floor): on a census-size table the suite takes minutes."""

from __future__ import annotations

from dpsynth.models.data.demo import make_demo_table
from dpsynth.tasks import validate
from tests.conftest import CARDIO_SCHEMA


def test_the_validate_stage_reuses_the_preflight_report_of_the_same_file(tmp_path, cardio_schema, monkeypatch):
    data = tmp_path / "table.csv"
    make_demo_table(cardio_schema, 300, seed=2).to_csv(data, sep=cardio_schema.separator, index=False)
    runs = []
    real = validate.validate_chunks

    def counted(*args, **kwargs):
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(validate, "validate_chunks", counted)
    first = validate.check_table_file(cardio_schema, data)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    stage = validate.validate_stage(run_dir, CARDIO_SCHEMA, data)
    assert len(runs) == 1 and stage.info == first.to_public_dict()
    # Other bytes: validated again.
    with data.open("a") as handle:
        handle.write(data.read_text().splitlines()[1] + "\n")
    validate.check_table_file(cardio_schema, data)
    assert len(runs) == 2
