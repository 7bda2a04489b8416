"""The files that make a bundle explain itself: the data dictionary, datapackage.json, the public summary
page, the CSV's separator and SHA256SUMS (and that it still holds after registration rewrites release.json)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.tasks.bundle import record_model_uri, verify_checksums, write_bundle
from dpsynth.tasks.data_dictionary import target_paragraph
from dpsynth.tasks.public_summary import write_public_summary
from tests.conftest import CARDIO_SCHEMA
from tests.tasks.test_public_release import make_release
from tests.tasks.test_registry import make_generator_file

ROWS = 300


@pytest.fixture(scope="module")
def record(cardio_schema):
    return make_release(cardio_schema, rows=ROWS)


@pytest.fixture(scope="module")
def synthetic(cardio_schema):
    # Stands in for the generator's rows: the same columns and types (a generator's sample is tested in
    # test_bundle.py); a fixed seed distinct from the conftest's "real" table.
    return make_demo_table(cardio_schema, ROWS, seed=23)[cardio_schema.column_names]


def write(folder: Path, record, synthetic, schema_path: Path = CARDIO_SCHEMA, **options) -> dict[str, Path]:
    generator = make_generator_file(
        folder / "ckpt" / "generator.pt", DatasetSchema.from_yaml(schema_path), epsilon=3.5, seed=0
    )
    notes = folder / "notes.md"
    notes.write_text("# Release notes\n")
    return write_bundle(
        folder / "bundle",
        record,
        synthetic_frame=synthetic,
        generator_file=generator,
        release_notes_path=notes,
        schema_path=schema_path,
        **options,
    )


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, record, synthetic) -> dict[str, Path]:
    return write(tmp_path_factory.mktemp("bundle"), record, synthetic)


# ------------------------------------------------------------------------------------ data dictionary


def test_the_dictionary_gives_each_column_its_label_unit_values_and_meanings(bundle, cardio_schema):
    text = bundle["data_dictionary"].read_text()
    rows = {line.split(" | ")[0].strip("| `"): line for line in text.splitlines() if line.startswith("| `")}
    assert list(rows) == [name if name != "cardio" else "cardio` (target)" for name in cardio_schema.column_names]
    assert "| Age | integer | continuous | days | 10585 to 23741, whole numbers |" in rows["age"]
    assert "| Weight | number | continuous | kg | 35 to 200, 1 decimal |" in rows["weight"]
    assert "1 = women, 2 = men" in rows["gender"]
    assert "1 = normal, 2 = above normal, 3 = well above normal" in rows["cholesterol"]
    assert "0 = no, 1 = yes" in rows["smoke"] and "mmHg" in rows["ap_hi"]
    assert "## Missing values" in text and "separated by commas" in text
    assert "epsilon 5.25 at delta 1e-05, for the whole release" in text


def test_the_dictionary_says_prominently_that_the_target_share_is_set_by_design(bundle, record):
    text = bundle["data_dictionary"].read_text()
    target = text.split("## The target column", 1)[1].split("## Columns", 1)[0]
    assert "> **The target column `cardio` (Cardiovascular disease): its share in these rows is set by design" in target
    # What release.json records, word for word: the privacy summary's statement of the public prior.
    recorded = json.loads(bundle["release_json"].read_text())["target_labels"]
    assert recorded == record.privacy["target_labels"] and "probability 0.5 (a public prior)" in recorded
    assert f'under `target_labels`: "{recorded}"' in target


def test_a_generated_target_is_said_to_be_generated(record, cardio_schema):
    privacy = {key: value for key, value in record.privacy.items() if key != "target_labels"}
    learned = dataclasses.replace(record, privacy=privacy)
    text = target_paragraph(cardio_schema, learned)
    assert "generated like every other column" in text and "set by design" not in text


def test_a_schema_without_labels_or_meanings_shows_names_and_codes(tmp_path, record, cardio_schema, synthetic):
    raw = yaml.safe_load(CARDIO_SCHEMA.read_text())
    for column in raw["columns"].values():
        for key in ("label", "description", "meanings"):
            column.pop(key, None)
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(raw))
    paths = write(tmp_path, record, synthetic, schema_path=bare)
    text = paths["data_dictionary"].read_text()
    assert "| `gender` | - | integer | binary | - | 1, 2 | - |" in text
    package = json.loads(paths["datapackage"].read_text())
    gender = package["resources"][0]["schema"]["fields"][1]
    assert gender["title"] == "gender" and "categories" not in gender and gender["constraints"]["enum"] == [1, 2]


# ------------------------------------------------------------------------------------ datapackage.json

RESOURCE_NAME = re.compile(r"^[a-z0-9._-]+$")
FIELD_TYPES = {"string", "number", "integer", "boolean"}


def test_datapackage_json_has_the_spec_required_structure(bundle):
    package = json.loads(bundle["datapackage"].read_text())
    # Data Package: `resources`, a non-empty list; each resource a `name` and a `path` to a bundle file.
    assert package["$schema"].startswith("https://datapackage.org/profiles/2.0/")
    assert RESOURCE_NAME.match(package["name"]) and package["resources"]
    names = [resource["name"] for resource in package["resources"]]
    assert len(set(names)) == len(names) == 2
    for resource in package["resources"]:
        assert RESOURCE_NAME.match(resource["name"]) and (bundle["bundle"] / resource["path"]).is_file()
        assert resource["type"] == "table" and resource["format"] in ("csv", "parquet")
        # Table Schema: `fields`, each with a name and a known type; categories as value and label.
        for field in resource["schema"]["fields"]:
            assert set(field) <= {"name", "title", "description", "type", "constraints", "categories"}
            assert field["name"] and field["type"] in FIELD_TYPES
            for category in field.get("categories", []):
                assert set(category) == {"value", "label"} and category["value"] in field["constraints"]["enum"]
    assert package["resources"][0]["schema"] == package["resources"][1]["schema"]


def _csv_values_meet(field: dict, values: pd.Series) -> bool:
    """Whether a CSV column's text values meet a Table Schema field (type and constraints)."""
    text = values.astype(str)
    if field["type"] == "integer":
        parsed = text.map(int)
    elif field["type"] == "number":
        parsed = text.map(float)
    else:
        parsed = text
    constraints = field["constraints"]
    if constraints.get("required") and (text == "").any():
        return False
    if "enum" in constraints and not parsed.isin(constraints["enum"]).all():
        return False
    return parsed.min() >= constraints.get("minimum", parsed.min()) and parsed.max() <= constraints.get(
        "maximum", parsed.max()
    )


def test_datapackage_json_describes_synthetic_csv_exactly(bundle, cardio_schema):
    package = json.loads(bundle["datapackage"].read_text())
    csv = next(r for r in package["resources"] if r["path"] == "synthetic.csv")
    delimiter = csv["dialect"]["delimiter"]
    header = bundle["csv"].read_text().splitlines()[0]
    fields = csv["schema"]["fields"]
    assert header.split(delimiter) == [field["name"] for field in fields] == cardio_schema.column_names
    table = pd.read_csv(bundle["csv"], sep=delimiter, dtype=str, keep_default_na=False)
    assert all(_csv_values_meet(field, table[field["name"]]) for field in fields)
    by_name = {field["name"]: field for field in fields}
    assert by_name["age"]["constraints"] == {"required": True, "minimum": 10585, "maximum": 23741}
    assert by_name["weight"]["type"] == "number" and by_name["weight"]["description"].endswith("Unit: kg.")
    assert by_name["gender"]["categories"] == [{"value": 1, "label": "women"}, {"value": 2, "label": "men"}]
    parquet = next(r for r in package["resources"] if r["path"] == "synthetic.parquet")
    assert list(pd.read_parquet(bundle["parquet"]).columns) == [field["name"] for field in parquet["schema"]["fields"]]


# ------------------------------------------------------------------------------------ CSV separator


def test_the_csv_separator_is_a_comma_unless_the_schema_or_the_caller_sets_one(tmp_path, record, synthetic):
    raw = yaml.safe_load(CARDIO_SCHEMA.read_text())
    raw["release_separator"] = "|"
    piped = tmp_path / "piped.yaml"
    piped.write_text(yaml.safe_dump(raw, sort_keys=False))
    for name, schema_path, options, expected in (
        ("from-schema", piped, {}, "|"),
        ("from-caller", piped, {"separator": ";"}, ";"),
    ):
        paths = write(tmp_path / name, record, synthetic, schema_path=schema_path, **options)
        pd.testing.assert_frame_equal(pd.read_csv(paths["csv"], sep=expected), synthetic)
        assert json.loads(paths["release_json"].read_text())["files"]["synthetic.csv"] == {"separator": expected}
        assert json.loads(paths["datapackage"].read_text())["resources"][0]["dialect"]["delimiter"] == expected
    assert "separated by vertical bars" in (tmp_path / "from-schema" / "bundle" / "DATA_DICTIONARY.md").read_text()


# ------------------------------------------------------------------------------------ SHA256SUMS


def _listed(bundle_dir: Path) -> dict[str, str]:
    lines = (bundle_dir / "SHA256SUMS").read_text().splitlines()
    return {name: digest for digest, name in (re.fullmatch(r"([0-9a-f]{64})  (\S+)", line).groups() for line in lines)}


def _sha256sum_check(bundle_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sha256sum", "-c", "SHA256SUMS"], cwd=bundle_dir, capture_output=True, text=True, check=False
    )


def test_sha256sums_covers_every_file_and_survives_registration(tmp_path, record, synthetic):
    paths = write(tmp_path, record, synthetic)
    bundle_dir = paths["bundle"]
    for when in ("written", "registered"):
        listed = _listed(bundle_dir)
        assert sorted(listed) == sorted(p.name for p in bundle_dir.iterdir() if p.name != "SHA256SUMS"), when
        assert all(hashlib.sha256((bundle_dir / n).read_bytes()).hexdigest() == d for n, d in listed.items()), when
        assert verify_checksums(bundle_dir) == [], when
        if shutil.which("sha256sum"):
            assert _sha256sum_check(bundle_dir).returncode == 0, when
        record_model_uri(bundle_dir, "models:/cardio-test/1")
    assert json.loads(paths["release_json"].read_text())["model_uri"] == "models:/cardio-test/1"
    assert (bundle_dir / "SHA256SUMS").stat().st_mode & 0o777 == 0o644

    # A changed, a missing and an unlisted file are each found.
    paths["csv"].write_bytes(paths["csv"].read_bytes() + b"\n")
    (bundle_dir / "SUMMARY.html").unlink()
    (bundle_dir / "extra.txt").write_text("x")
    assert verify_checksums(bundle_dir) == ["SUMMARY.html", "extra.txt", "synthetic.csv"]
    if shutil.which("sha256sum"):
        assert _sha256sum_check(bundle_dir).returncode != 0


# ------------------------------------------------------------------------------------ SUMMARY.html


def test_the_summary_has_one_image_per_column_and_the_heatmap(bundle, cardio_schema, record):
    page = bundle["summary"].read_text()
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,[A-Za-z0-9+/=]+">', page)
    assert images == [*cardio_schema.column_names, "correlations"]
    assert "epsilon 5.25 at delta 1e-05" in page and record.statement.covers.replace("'", "&#x27;") in page
    assert "set by design, not learned" in page
    assert len(page) < 200_000  # small palette images: a light page


class _FilesOpened:
    """Every file opened while active (the interpreter's audit events), to show what a call reads."""

    def __init__(self) -> None:
        self.active = False
        self.paths: list[Path] = []
        sys.addaudithook(self._hook)  # a hook cannot be removed: it records only while active

    def _hook(self, event: str, args: tuple) -> None:
        if self.active and event == "open" and isinstance(args[0], (str, Path)):
            self.paths.append(Path(args[0]).resolve())


def test_the_summary_is_drawn_from_the_synthetic_rows_it_is_given_only(tmp_path, cardio_schema, record, synthetic):
    real = make_demo_table(cardio_schema, 500, seed=1)
    real.to_csv(tmp_path / "real.csv", index=False)  # lies beside it: must not be read
    (tmp_path / "schema.yaml").write_text(CARDIO_SCHEMA.read_text())
    opened = _FilesOpened()
    opened.active = True
    try:
        page = write_public_summary(tmp_path / "SUMMARY.html", synthetic, cardio_schema, record).read_text()
    finally:
        opened.active = False
    assert {p for p in opened.paths if tmp_path.resolve() in p.parents} == {(tmp_path / "SUMMARY.html").resolve()}
    # The same rows draw the same page; other rows another one.
    again = write_public_summary(tmp_path / "again.html", synthetic.copy(), cardio_schema, record).read_text()
    other = write_public_summary(tmp_path / "other.html", real[cardio_schema.column_names], cardio_schema, record)
    assert page == again and other.read_text() != page
