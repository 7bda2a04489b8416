"""The bad-input catalogue for configuration: malformed profiles and dataset schemas given to the real
command line. Each must end with exit status 2 and one line on stderr that names the bad key's path,
never a traceback, and before the run folder exists (preflight validates before `open_run`)."""

import subprocess
import sys

import pytest
import yaml

from dpsynth.flows.cli import main
from tests.conftest import CARDIO_SCHEMA, ROOT

SMOKE_PROFILE = CARDIO_SCHEMA.parent / "profiles" / "smoke.yaml"

# (case id, profile file text, what stderr must name). Each text is the whole profile file.
BAD_PROFILES = [
    ("checkpoint-every-zero", "gan: {checkpoint_every: 0}", "gan.checkpoint_every: must be at least 1 (got 0)"),
    (
        "iterations-not-a-multiple",
        "gan: {iterations: 1500, checkpoint_every: 1000}",
        "gan.checkpoint_every: iterations (1500) must be a multiple",
    ),
    (
        "checkpoint-after-the-end",
        "gan: {iterations: 100, checkpoint_every: 200}",
        "gan.checkpoint_every: must be at most",
    ),
    ("typo-in-gan", "gan: {iteratons: 100}", "gan.iteratons: unknown key (did you mean 'iterations'?)"),
    ("typo-at-top", "setings: [{name: k10, discriminators: 10}]", "setings: unknown key (did you mean 'settings'?)"),
    ("text-for-an-integer", "gan: {batch_size: big}", "gan.batch_size: expected an integer (got 'big')"),
    ("boolean-for-an-integer", "gan: {batch_size: true}", "gan.batch_size: expected an integer (got true)"),
    ("float-for-an-integer", "seed: 1.5", "seed: expected an integer (got 1.5)"),
    ("huge-integer", "seed: 123456789012345678901234567890", "seed: must be at most 2147483647"),
    ("nan-delta", "privacy: {delta: .nan}", "privacy.delta: must be a finite number (got nan)"),
    ("infinite-noise", "privacy: {noise_multiplier: .inf}", "privacy.noise_multiplier: must be a finite number"),
    ("delta-above-one", "privacy: {delta: 2}", "privacy.delta: must be below 1"),
    ("negative-budget", "privacy: {epsilon_budget: -1}", "privacy.epsilon_budget: must be above 0"),
    ("unknown-protocol", "protocol: sloppy", "protocol: 'sloppy' is not one of 'honest' or 'thesis'"),
    ("unknown-output-head", "gan: {output_head: softmax}", "gan.output_head: 'softmax' is not one of"),
    ("unknown-device", "device: gpu", "device: 'gpu' is not a device"),
    ("split-of-two", "split: [0.5, 0.5]", "split: expected exactly 3 values (got 2)"),
    (
        "split-not-summing-to-one",
        "split: [0.5, 0.4, 0.2]",
        "split: the train, validation and test fractions must sum to 1",
    ),
    ("no-settings", "settings: []", "settings: expected at least 1 value (got 0)"),
    ("settings-as-a-mapping", "settings: {name: k10, discriminators: 10}", "settings: expected a list"),
    ("setting-without-name", "settings: [{discriminators: 10}]", "settings[0]: missing required key 'name'"),
    (
        "zero-discriminators",
        "settings: [{name: k0, discriminators: 0}]",
        "settings[0].discriminators: must be at least 1",
    ),
    (
        "repeated-setting-names",
        "settings: [{name: a, discriminators: 2}, {name: a, discriminators: 3}]",
        "settings: setting names must be unique (repeated: a)",
    ),
    ("gan-is-null", "gan: null", "gan: expected a mapping of keys to values (got null)"),
    ("gan-is-a-list", "gan: [1, 2]", "gan: expected a mapping of keys to values"),
    ("nested-wrong-shape", "gan: {generator_hidden: [[128]]}", "gan.generator_hidden[0]: expected an integer"),
    ("drawn-levels-without-a-softmax", "dpautogan: {head: tanh}", "dpautogan.level_decoding: sample needs head: typed"),
    (
        "moment-fit-without-a-gaussian",
        "dpautogan: {moment_noise: 20.0}",
        "dpautogan.moment_noise: a moment fit needs latent_model: gaussian",
    ),
    ("marginals-without-noise", "marginals: {enabled: true, rho: .inf}", "marginals.rho: must be a finite number"),
    ("marginals-free", "marginals: {enabled: true, rho: 0}", "marginals.rho: must be above 0"),
    ("typo-in-marginals", "marginals: {noise: 3}", "marginals.noise: unknown key"),
    ("marginals-oversample-zero", "marginals: {oversample: 0}", "marginals.oversample: must be at least 1"),
    (
        "marginals-selection-share-one",
        "marginals: {selection_share: 1.0}",
        "marginals.selection_share: must be below 1",
    ),
    ("unknown-penalty", "evaluation: {penalties: [l3]}", "evaluation.penalties[0]: 'l3' is not one of 'l1' or 'l2'"),
    ("name-with-a-slash", "name: ../elsewhere", "name: '../elsewhere' is not a usable name"),
    ("date-for-a-seed", "seed: 2024-01-01", "seed: expected an integer (got 2024-01-01)"),
    ("a-list-not-a-mapping", "- gan\n- privacy\n", "must hold a mapping of keys to values, not a list"),
    ("a-string-not-a-mapping", "just some text", "must hold a mapping of keys to values, not a text value"),
    ("not-yaml", "gan: {iterations: [1, 2}", "is not valid YAML"),
]


def _cardio() -> dict:
    return yaml.safe_load(CARDIO_SCHEMA.read_text())


def _schema(mutate) -> str:
    raw = _cardio()
    mutate(raw)
    return yaml.safe_dump(raw, sort_keys=False)


def _set(path: str, value):
    """A mutation setting `a.b.c` of the Cardio schema to `value`."""

    def mutate(raw):
        *parents, last = path.split(".")
        node = raw
        for key in parents:
            node = node[key]
        node[last] = value

    return mutate


def _drop(path: str):
    def mutate(raw):
        *parents, last = path.split(".")
        node = raw
        for key in parents:
            node = node[key]
        del node[last]

    return mutate


# (case id, schema file text, what stderr must name).
BAD_SCHEMAS = [
    ("separator-typo", _schema(_set("seperator", ";")), "seperator: unknown key (did you mean 'separator'?)"),
    (
        "column-key-typo",
        _schema(_set("columns.age.bound", [1, 2])),
        "columns.age.bound: unknown key (did you mean 'bounds'?)",
    ),
    ("missing-target", _schema(_drop("target")), "missing required key 'target'"),
    ("missing-columns", _schema(_drop("columns")), "missing required key 'columns'"),
    ("unknown-type", _schema(_set("columns.age.type", "numeric")), "columns.age.type: 'numeric' is not one of"),
    ("missing-type", _schema(_drop("columns.age.type")), "columns.age: missing required key 'type'"),
    (
        "continuous-without-bounds",
        _schema(_drop("columns.age.bounds")),
        "columns.age.bounds: a continuous column needs",
    ),
    ("bounds-reversed", _schema(_set("columns.age.bounds", [5, 1])), "columns.age.bounds: must satisfy low < high"),
    (
        "bounds-of-three",
        _schema(_set("columns.age.bounds", [1, 2, 3])),
        "columns.age.bounds: expected exactly 2 values",
    ),
    ("bounds-as-text", _schema(_set("columns.age.bounds", "1-2")), "columns.age.bounds: expected a list"),
    ("bounds-nan", "", "columns.age.bounds[1]: must be a finite number (got nan)"),
    ("bounds-huge", "", "columns.age.bounds[1]: must be a finite number (got inf)"),
    ("text-in-bounds", _schema(_set("columns.age.bounds", ["low", 5])), "columns.age.bounds[0]: expected a number"),
    ("negative-decimals", _schema(_set("columns.weight.decimals", -1)), "columns.weight.decimals: must be at least 0"),
    ("decimals-on-a-binary", _schema(_set("columns.gender.decimals", 1)), "columns.gender.decimals: only continuous"),
    ("one-level", _schema(_set("columns.gender.levels", [1])), "columns.gender.levels: needs a list of at least two"),
    (
        "three-binary-levels",
        _schema(_set("columns.smoke.levels", [0, 1, 2])),
        "columns.smoke.levels: a binary column has exactly two",
    ),
    (
        "repeated-levels",
        _schema(_set("columns.gluc.levels", [1, 2, 2])),
        "columns.gluc.levels: needs a list of at least two distinct",
    ),
    ("boolean-levels", "", "columns.smoke.levels[0]: got false: YAML reads unquoted yes/no"),
    (
        "mixed-levels",
        _schema(_set("columns.gluc.levels", [1, "two", 3])),
        "columns.gluc.levels: levels must be all numbers or all text",
    ),
    (
        "null-level",
        _schema(_set("columns.gluc.levels", [1, None, 3])),
        "columns.gluc.levels[1]: a level must be a number or a text",
    ),
    (
        "levels-on-continuous",
        _schema(_set("columns.age.levels", [1, 2])),
        "columns.age.levels: only binary and categorical",
    ),
    (
        "column-is-null",
        _schema(_set("columns.age", None)),
        "columns.age: expected a mapping of keys to values (got null)",
    ),
    ("columns-as-a-list", _schema(_set("columns", ["age", "gender"])), "columns: expected a mapping of keys to values"),
    ("target-not-declared", _schema(_set("target", "outcome")), "target: 'outcome' is not a declared column"),
    ("target-continuous", _schema(_set("target", "age")), "target: target 'age' must be a binary column"),
    (
        "id-column-is-a-feature",
        _schema(_set("id_column", "age")),
        "id_column: id column 'age' must not also be a feature",
    ),
    ("two-character-separator", _schema(_set("separator", ";;")), "separator: must be one character"),
    ("text-version", _schema(_set("version", "1")), "version: expected an integer (got '1')"),
    ("name-is-null", _schema(_set("name", None)), "name: expected a text value (got null)"),
    ("a-list-not-a-mapping", "- name\n- target\n", "expected a mapping of keys to values (got ['name', 'target'])"),
    ("empty-file", "", "expected a mapping of keys to values (got null)"),
]
# YAML written by hand where safe_dump cannot say it: NaN, a float beyond double range, unquoted booleans.
_HAND_WRITTEN = {
    "bounds-nan": CARDIO_SCHEMA.read_text().replace("bounds: [10585, 23741]", "bounds: [10585, .nan]"),
    "bounds-huge": CARDIO_SCHEMA.read_text().replace("bounds: [10585, 23741]", "bounds: [10585, 1.0e+400]"),
    "boolean-levels": CARDIO_SCHEMA.read_text().replace(
        '    type: binary\n    levels: [0, 1]\n    meanings: {0: "no", 1: "yes"}\n  alco:',
        "    type: binary\n    levels: [no, yes]\n  alco:",
    ),
}
BAD_SCHEMAS = [(case, _HAND_WRITTEN.get(case, text), fragment) for case, text, fragment in BAD_SCHEMAS]


def test_the_catalogue_is_large_and_every_hand_written_case_differs_from_the_good_schema():
    assert len(BAD_PROFILES) >= 15 and len(BAD_SCHEMAS) >= 15
    assert all(text != CARDIO_SCHEMA.read_text() for text in _HAND_WRITTEN.values())


def _release(tmp_path, schema, profile, data, capsys) -> tuple[int, str]:
    out = tmp_path / "run"
    code = main(["release", "--config", str(schema), "--data", str(data), "--profile", str(profile), "--out", str(out)])
    err = capsys.readouterr().err
    assert not out.exists(), "a run folder was created before the configuration was valid"
    return code, err


def _assert_readable(code: int, err: str, fragment: str, file_name: str) -> None:
    assert code == 2, err
    assert fragment in err
    assert file_name in err  # the message names the file it is about
    assert err.startswith("dpsynth release: ") and err.strip().count("\n") == 0  # one paragraph
    for noise in ("Traceback", "pydantic", "For further information", "Input should"):
        assert noise not in err


@pytest.mark.parametrize("case, text, fragment", BAD_PROFILES, ids=[c[0] for c in BAD_PROFILES])
def test_a_malformed_profile_is_refused_at_the_edge(tmp_path, demo_csv, capsys, case, text, fragment):
    profile = tmp_path / f"{case}.yaml"
    profile.write_text(text)
    code, err = _release(tmp_path, CARDIO_SCHEMA, profile, demo_csv, capsys)
    _assert_readable(code, err, fragment, profile.name)


@pytest.mark.parametrize("case, text, fragment", BAD_SCHEMAS, ids=[c[0] for c in BAD_SCHEMAS])
def test_a_malformed_schema_is_refused_at_the_edge(tmp_path, demo_csv, capsys, case, text, fragment):
    schema = tmp_path / f"{case}.yaml"
    schema.write_text(text)
    code, err = _release(tmp_path, schema, SMOKE_PROFILE, demo_csv, capsys)
    _assert_readable(code, err, fragment, schema.name)


def test_a_profile_extending_a_malformed_one_names_the_key(tmp_path, demo_csv, capsys):
    (tmp_path / "base.yaml").write_text("gan: {checkpoint_every: 0}\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base\nseed: 3\n")
    code, err = _release(tmp_path, CARDIO_SCHEMA, child, demo_csv, capsys)
    _assert_readable(code, err, "gan.checkpoint_every: must be at least 1 (got 0)", "child.yaml")


def test_no_traceback_reaches_the_user_of_a_real_process(tmp_path, demo_csv):
    # The issue's own report: this profile used to end in a ZeroDivisionError traceback.
    profile = tmp_path / "bad.yaml"
    profile.write_text("gan: {checkpoint_every: 0}\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpsynth.flows.cli",
            "release",
            "--config",
            str(CARDIO_SCHEMA),
            "--data",
            str(demo_csv),
            "--profile",
            str(profile),
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "gan.checkpoint_every: must be at least 1 (got 0)" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
