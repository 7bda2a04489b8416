import pytest
import yaml

from dpsynth.models.config import load_profile
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError
from tests.conftest import CARDIO_SCHEMA


def test_cardio_schema_declares_every_column(cardio_schema):
    assert cardio_schema.column_names == [
        "age",
        "gender",
        "height",
        "weight",
        "ap_hi",
        "ap_lo",
        "cholesterol",
        "gluc",
        "smoke",
        "alco",
        "active",
        "cardio",
    ]
    assert cardio_schema.target == "cardio" and cardio_schema.id_column == "id"
    assert cardio_schema.separator == ";"
    assert cardio_schema.column("height").bounds[1] == 210
    assert cardio_schema.column("cholesterol").levels == (1, 2, 3)
    assert cardio_schema.encoded_width == 16  # thesis: generator output width 16


def _write(tmp_path, raw):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.pop("target"), "missing required key 'target'"),
        (lambda r: r["columns"]["age"].pop("bounds"), "public 'bounds"),
        (lambda r: r["columns"]["age"].update(bounds=[5, 1]), "low < high"),
        (lambda r: r["columns"]["gender"].update(levels=[1]), "at least two"),
        (lambda r: r["columns"]["smoke"].update(levels=[0, 1, 2]), "exactly two"),
        (lambda r: r["columns"]["age"].update(type="numeric"), "not one of"),
        (lambda r: r.update(target="age"), "must be a binary column"),
        (lambda r: r.update(release_separator="::"), "release_separator: must be one character"),
        # Documentation keys: every message names the key's path.
        (
            lambda r: r["columns"]["gender"].update(meanings={1: "women", 3: "men"}),
            r"columns\.gender\.meanings: a meaning for an undeclared level: \[3\]",
        ),
        (
            lambda r: r["columns"]["gender"].update(meanings={"1": "women"}),
            "a number and its quoted text are different levels",
        ),
        (
            lambda r: r["columns"]["age"].update(meanings={1: "x"}),
            r"columns\.age\.meanings: only binary and categorical",
        ),
        (lambda r: r["columns"]["smoke"].update(meanings={0: False}), r"columns\.smoke\.meanings.*quote the meaning"),
        (lambda r: r["columns"]["smoke"].update(meanings={0: ""}), "must be non-empty text"),
        (lambda r: r["columns"]["age"].update(label=" "), r"columns\.age\.label: must be non-empty text"),
        (lambda r: r["columns"]["age"].update(labels="Age"), r"columns\.age\.labels: unknown key"),
    ],
)
def test_malformed_schema_is_a_config_error(tmp_path, mutate, message):
    raw = yaml.safe_load(CARDIO_SCHEMA.read_text())
    mutate(raw)
    with pytest.raises(ConfigError, match=message):
        DatasetSchema.from_yaml(_write(tmp_path, raw))


def test_cardio_columns_say_what_their_codes_mean(cardio_schema):
    gender, age, cardio = cardio_schema.column("gender"), cardio_schema.column("age"), cardio_schema.column("cardio")
    assert gender.meanings == ((1, "women"), (2, "men")) and gender.meaning(2) == "men" and gender.title == "Gender"
    assert cardio_schema.column("cholesterol").meaning(3) == "well above normal" and cardio.meaning(0) == "no"
    assert age.unit == "days" and age.label == "Age" and age.meanings == () and age.meaning(1) == ""
    # The input is read with semicolons; the bundle's CSV keeps the default comma.
    assert cardio_schema.separator == ";" and cardio_schema.release_separator == ","


def test_documentation_keys_are_optional_and_meanings_may_be_partial(tmp_path):
    raw = {
        "name": "toy",
        "target": "y",
        "columns": {
            "colour": {"type": "categorical", "levels": ["r", "g", "b"], "meanings": {"b": "blue", "r": "red"}},
            "y": {"type": "binary", "levels": [0, 1]},
        },
    }
    schema = DatasetSchema.from_yaml(_write(tmp_path, raw))
    colour = schema.column("colour")
    assert colour.meanings == (("r", "red"), ("b", "blue")) and colour.meaning("g") == ""  # in level order
    assert schema.column("y").title == "y" and schema.column("y").meanings == ()


def test_every_shipped_schema_loads():
    for path in sorted(CARDIO_SCHEMA.parent.glob("*.yaml")):
        schema = DatasetSchema.from_yaml(path)
        assert all(column.label for column in schema.columns), path.name


def test_another_table_is_just_another_yaml(tmp_path):
    raw = {
        "name": "toy",
        "target": "y",
        "columns": {
            "x": {"type": "continuous", "bounds": [0, 1], "decimals": 2},
            "colour": {"type": "categorical", "levels": ["red", "green", "blue"]},
            "y": {"type": "binary", "levels": ["no", "yes"]},
        },
    }
    schema = DatasetSchema.from_yaml(_write(tmp_path, raw))
    assert schema.encoded_width == 5 and schema.separator == ","


def test_missing_schema_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        DatasetSchema.from_yaml(tmp_path / "nope.yaml")


def test_profiles_load_and_extend(tmp_path):
    thesis = load_profile("thesis", CARDIO_SCHEMA)
    assert [s.discriminators for s in thesis.settings] == [1, 250, 500, 750, 1000, 1500]
    assert thesis.settings[0].private is False
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "base.yaml").write_text("seed: 3\ngan: {iterations: 2000, checkpoint_every: 1000}\n")
    (tmp_path / "profiles" / "child.yaml").write_text("extends: base\ngan: {batch_size: 64}\n")
    child = load_profile("child", tmp_path / "schema.yaml")
    assert child.seed == 3 and child.gan.batch_size == 64 and child.gan.iterations == 2000


@pytest.mark.parametrize(
    "text, message",
    [
        ("gan: {iterationz: 5}", "unknown key"),
        ("gan: {batch_size: 'big'}", "expected an integer"),
        ("protocol: sloppy", "protocol"),
        ("gan: {iterations: 1500, checkpoint_every: 1000}", "multiple of checkpoint_every"),
    ],
)
def test_bad_profiles_are_config_errors(tmp_path, text, message):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_profile("bad", tmp_path / "schema.yaml")


@pytest.mark.parametrize("path", sorted((CARDIO_SCHEMA.parent / "profiles").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_profile_loads_and_names_its_release_setting(path):
    from dpsynth.models.generators import generator_for

    profile = load_profile(path.stem, CARDIO_SCHEMA)
    assert profile.name == path.stem
    if len(profile.settings) == 1 or profile.release_setting:
        setting = profile.release_target()
        plan = generator_for(profile, setting).plan(profile, setting)  # its own generator's accountant
        assert plan.iterations[0] == 0 and plan.last == plan.iterations[-1]
        if profile.budget_for(setting) is not None and setting.private:
            assert plan.epsilon <= profile.budget_for(setting)
