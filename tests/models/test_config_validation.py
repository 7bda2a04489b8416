"""Profiles and schemas validated at the edge (models/config_validation.py): the messages, the run
identities that must not move, and property-based tests feeding any YAML value to any key."""

import datetime
import math
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsynth.models.config import Profile, Setting, load_profile, profile_spec
from dpsynth.models.config_validation import dotted, known_keys
from dpsynth.models.data.schema import DatasetSchema, SchemaSpec
from dpsynth.models.errors import ConfigError
from dpsynth.models.generator_registry import names, registrations
from dpsynth.models.generators.gswgan.config import GanConfig
from tests.conftest import CARDIO_SCHEMA

# config_hash of every shipped profile as the hand-written loader computed it before pydantic: run
# folders are identified by it, so a change of loader must not move it. Update an entry only when that
# profile's content changes on purpose (all four moved once, with the same value from both loaders, when
# privacy.lifetime_budget was added and release_rows became a public number; and again when profiles
# gained `generator`, the DP-CGAN and DP-auto-GAN sections, per-setting generator and budget, and
# evaluation.experiment_choice; and when the DP-auto-GAN section gained
# `level_decoding`, the reconstruction weights and the latent model; and when it gained the moment fit;
# and when profiles gained `trial` and the GS-WGAN section `critic_refresh`; and when the MST generator
# registered its section `mst`, which every profile holds with its defaults; and when AIM, RDP-CGAN and
# DP-Fed-CTGAN registered theirs; and when RDP-CGAN's section gained the gradient penalty, the averaged
# generator and the critic's own channels, with new defaults; and when its autoencoder stopped reading
# the target by default, `autoencoder_target`; and when the measured marginals, MST and AIM gained
# `shape_share`, the share of rho spent on the continuous columns' fine histograms; and when AIM's section
# gained `numeric_pair_weight` and `numeric_pair_groups`, the pairs of continuous columns; and when
# profiles gained the `input` section, `max_repaired_share`; `default` alone when it turned on its
# measured marginals at rho 0.05, issue 41 item 4; `compare` alone when its settings came from the registry,
# `settings_for_every_generator`: the same fourteen settings, in the registry's order, issue 43 item 2;
# and when MST's section gained `one_way_share` and `selection_share` and AIM's `one_way_share`, with
# `mst-eps1` and `aim-eps1` setting them, issue 41; and when AIM's section gained `numeric_pair_share` and
# `pair_round_groups`, the pair rounds, `aim-eps1` keeping the share at 0 after it cost AUC, issue 41 item 3;
# `aim-eps1` alone when its `one_way_share` became `auto`, derived from public facts, utility-study section 16).
SHIPPED_HASHES = {
    "default": "e7607541f3a1b0b35929ecb092237b22607b195754bb82781b1f92b81139615a",
    "smoke": "12c544d5ac8d15eb170f407857163f4d9e54d96d0bb69614e71c0973cca08668",
    "thesis-k1500": "cc60a92a1579019115a7f00324de8cda3c884890be62e8289867cc90f7353ec2",
    "thesis": "dc70db5987e3221c86be61721acdb7a8c922aca3f6ca6eafcacbf805218bded1",
    "compare": "92e7775fe3758b44aa86c39ec75ebc7f6a812649dc5399175226c6b2330cda2e",
    "eps1": "1deb38a69a269ed3a3dea893647944f3b5c003a0386e2ea1ba11021bad49fec9",
    "eps3": "d1e29c0f1c7368f20cdf9b3e63a963478c385eb231613be115f72518dec3f84d",
    "census-eps3": "80b77f33800f5f69ee82cb8f391a7ba716cd311b0da2417186b382a41c31cf58",
    "mst-eps1": "4670c98729c2e584f4e3e86d30071c0bdb179cf201b70ab346a1fa0d6b56f4d8",
    "aim-eps1": "250de0538453743e143a1a1a711e68d762cf0076aba8c28b2a32fbdaad6cc7f0",
    "rdpcgan-eps1": "89cf1670171f6c5aa0fc3942dcf28c29cf5639d9155a123ca6dbcaafb50be931",
    "dpfedctgan-eps1": "cfee627f341a9a57a36892f4be6ac2644f6ed6539859e126c3f1fc163406f20a",
}
PROFILES = sorted((CARDIO_SCHEMA.parent / "profiles").glob("*.yaml"))


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_a_shipped_profile_keeps_its_config_hash(path):
    assert path.stem in SHIPPED_HASHES, f"new profile {path.stem}: add its config_hash to SHIPPED_HASHES"
    assert load_profile(path.stem, CARDIO_SCHEMA).config_hash == SHIPPED_HASHES[path.stem]


def test_numbers_keep_their_types_in_the_hash(tmp_path):
    # An integer given for a float key is stored as a float, as the hand-written loader did.
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "p.yaml").write_text("privacy: {epsilon_budget: 10}\ngan: {betas: [0, 0.9]}\n")
    profile = load_profile("p", tmp_path / "schema.yaml")
    assert isinstance(profile.privacy.epsilon_budget, float) and profile.gan.betas == (0.0, 0.9)
    assert isinstance(profile.gan.betas[0], float) and isinstance(profile.seed, int)


def _load_text(tmp_path, text: str) -> Profile:
    (tmp_path / "profiles").mkdir(exist_ok=True)
    (tmp_path / "profiles" / "p.yaml").write_text(text)
    return load_profile("p", tmp_path / "schema.yaml")


def test_the_smoke_profile_sizes_each_generator_by_its_own_config():
    smoke, default = load_profile("smoke", CARDIO_SCHEMA), load_profile("default", CARDIO_SCHEMA)
    for r in registrations():
        model = r.config_model()
        assert smoke.sections[r.section] == model(**model.smoke), r.name
    # The sizing is the config's, not its defaults: DP-CGAN trains 40 iterations in smoke, not 8,000.
    assert smoke.dpcgan.iterations == 40 and default.dpcgan.iterations == 8000
    assert smoke.gan.pretrain_iterations == 20 and default.gan.pretrain_iterations != 20


def test_smoke_sizing_is_read_from_the_config_and_a_profile_overrides_it(tmp_path, monkeypatch):
    from dpsynth.models.generators.dpcgan.config import DPCGANConfig

    monkeypatch.setattr(DPCGANConfig, "smoke", {"iterations": 6, "checkpoint_every": 3})
    sized = _load_text(tmp_path, "extends: smoke\ndpcgan: {checkpoint_every: 2}\n")
    assert (sized.dpcgan.iterations, sized.dpcgan.checkpoint_every) == (6, 2)
    assert _load_text(tmp_path, "smoke_sizing: false\n").dpcgan == DPCGANConfig()
    with pytest.raises(ConfigError, match="smoke_sizing: expected true or false"):
        _load_text(tmp_path, "smoke_sizing: yes please\n")


def test_compare_sets_every_registered_generator_at_each_budget():
    profile = load_profile("compare", CARDIO_SCHEMA)
    expected = {(f"{name}-eps{b}", name, float(b)) for name in names() for b in (1, 3)}
    assert {(s.name, profile.generator_of(s), s.epsilon_budget) for s in profile.settings} == expected
    # GS-WGAN's own settings are kept where listed (1,000 critics); the others are each generator's defaults.
    assert [s.discriminators for s in profile.settings[:2]] == [1000, 1000]
    assert all(s.discriminators is None for s in profile.settings[2:])


def test_settings_for_every_generator_keep_a_listed_setting_and_are_not_redone_by_a_child(tmp_path):
    text = (
        "settings: [{name: mst-low, generator: mst, epsilon_budget: 0.5}, {name: mst-eps2, generator: mst},\n"
        "           {name: gswgan-eps2, generator: gswgan, discriminators: 10}]\n"
        "settings_for_every_generator: [{name: eps2, epsilon_budget: 2.0}]\n"
        "privacy: {epsilon_budget: 9.0}\n"
    )
    profile = _load_text(tmp_path, text)
    by_name = {s.name: s for s in profile.settings}
    assert set(by_name) == {"mst-low"} | {f"{name}-eps2" for name in names()}
    assert by_name["mst-eps2"].epsilon_budget is None  # the listed one, not the template's
    assert by_name["dpcgan-eps2"].epsilon_budget == 2.0 and by_name["dpcgan-eps2"].generator == "dpcgan"
    (tmp_path / "profiles" / "child.yaml").write_text("extends: p\nsettings: [{name: only, generator: mst}]\n")
    assert [s.name for s in load_profile("child", tmp_path / "schema.yaml").settings] == ["only"]


@pytest.mark.parametrize(
    "value, message",
    [
        ("{name: eps1}", "expected a list of settings"),
        ("[]", "expected a list of settings"),
        ("[eps1]", "each entry is a mapping with a name"),
        ("[{epsilon_budget: 1.0}]", "each entry is a mapping with a name"),
        ("[{name: eps1, generator: mst}]", "names a generator: every registered one is set"),
    ],
)
def test_settings_for_every_generator_refuses_a_bad_template(tmp_path, value, message):
    with pytest.raises(ConfigError, match=message):
        _load_text(tmp_path, f"settings_for_every_generator: {value}\n")


@pytest.mark.parametrize(
    "text, message",
    [
        ("gan: {checkpoint_every: 0}", "profile 'p' ("),
        ("gan: {checkpoint_every: 0}", "p.yaml): gan.checkpoint_every: must be at least 1 (got 0)."),
        ("gan: {lr_critc: 0.1}", "gan.lr_critc: unknown key (did you mean 'lr_critic'?)"),
        (
            "privacy: {xyz: 1}",
            (
                "privacy.xyz: unknown key (known keys: approval_epsilon, choice_epsilon, clip, delta, "
                "epsilon_budget, lifetime_budget, noise_multiplier, planned_releases, releases_until)"
            ),
        ),
        ("marginals: {rho: 0}", "marginals.rho: must be above 0 (got 0)"),
        (
            "marginals: {sigma: 1.0}",
            (
                "marginals.sigma: unknown key (known keys: bins, enabled, oversample, rho, selection_share, "
                "selections, shape_share)"
            ),
        ),
        ("gan: {target_prior: 1.0}", "gan.target_prior: must be below 1 (got 1.0)"),
        ("gan: {generator_ema: 1.5}", "gan.generator_ema: must be below 1 (got 1.5)"),
        ("evaluation: {share_gap_weight: -1}", "evaluation.share_gap_weight: must be at least 0"),
        ("gan: {z_dim: 100000}", "gan.z_dim: must be at most 16384"),
        ("gan: {iterations: 1000000, checkpoint_every: 1}", "gives 1000000 checkpoints, at most 10000"),
        ("1: 2", "key 1: keys must be text"),
        ("extends: [a]", "extends: expected the name of a profile beside it"),
    ],
)
def test_profile_messages_name_the_key_path(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        _load_text(tmp_path, text)
    assert message in str(info.value)


def test_every_problem_of_a_file_is_listed_in_one_paragraph(tmp_path):
    with pytest.raises(ConfigError) as info:
        _load_text(tmp_path, "seed: x\nprotocol: y\ngan: {batch_size: 0}\n")
    text = str(info.value)
    assert "seed: expected an integer" in text and "protocol: 'y' is not one of" in text
    assert "gan.batch_size: must be at least 1" in text and "\n" not in text


def test_a_file_wrong_throughout_lists_the_first_problems_and_counts_the_rest(tmp_path):
    text = "\n".join(f"key{i}: 1" for i in range(12))
    with pytest.raises(ConfigError, match="and 4 more problems"):
        _load_text(tmp_path, text)


def test_a_profile_built_in_code_obeys_the_same_rules():
    with pytest.raises(ConfigError, match="gan.checkpoint_every: must be at least 1"):
        Profile(name="p", gan=GanConfig(checkpoint_every=0))
    with pytest.raises(ConfigError, match="settings: 'real' is reserved"):
        Profile(name="p", settings=(Setting("real", 3),))
    with pytest.raises(ConfigError, match="settings: setting names must be unique"):
        Profile(name="p").with_settings(Setting("a", 2), Setting("a", 3))
    assert Profile(name="p").with_settings(Setting("a", 2)).settings == (Setting("a", 2),)


def test_known_keys_follow_lists_and_mappings():
    assert "discriminators" in known_keys(profile_spec(), ("settings", 0))
    assert "iterations" in known_keys(profile_spec(), ("gan",))
    assert "bounds" in known_keys(SchemaSpec, ("columns", "any column name"))
    assert known_keys(profile_spec(), ("seed",)) == []


def test_schema_messages_name_the_file_and_key(tmp_path):
    path = tmp_path / "x.yaml"
    raw = yaml.safe_load(CARDIO_SCHEMA.read_text())
    raw["columns"]["age"]["bounds"] = [5, 1]
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as info:
        DatasetSchema.from_yaml(path)
    assert str(info.value) == f"schema {str(path)!r}: columns.age.bounds: must satisfy low < high (got [5, 1])."


def test_a_valid_schema_still_builds_the_same_columns(cardio_schema):
    assert cardio_schema.column("weight").bounds == (35.0, 200.0) and cardio_schema.column("weight").decimals == 1
    assert cardio_schema.column("gender").levels == (1, 2) and cardio_schema.column("gender").bounds is None
    assert cardio_schema.column("age").unit == "days" and cardio_schema.column("age").levels == ()


# ------------------------------------------------------------------------------ property-based
# Any YAML value at any key, top-level or nested: the loader either builds the object or raises a
# ConfigError with one readable line; nothing else (TypeError, ZeroDivisionError, ...) escapes.

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.dates(min_value=datetime.date(1990, 1, 1), max_value=datetime.date(2030, 1, 1)),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=6), st.integers()), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(node, prefix=()):
    """Every key path of a nested mapping (lists of mappings by index too)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield prefix + (key,)
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, prefix + (i,))


def _replace(node, path, value):
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _assert_readable(exc: ConfigError) -> None:
    text = str(exc)
    assert text and "\n" not in text
    for noise in ("pydantic", "Input should", "For further information"):
        assert noise not in text


def _yaml_plain(value):
    if isinstance(value, (tuple, list)):
        return [_yaml_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _yaml_plain(v) for k, v in value.items()}
    return value


# The smoke profile with its generators' sections written out (their smoke sizing, which `smoke_sizing`
# reads from their config models), so that their keys are fed any value too.
_PROFILE = {
    **yaml.safe_load((CARDIO_SCHEMA.parent / "profiles" / "smoke.yaml").read_text()),
    **{r.section: _yaml_plain(dict(r.config_model().smoke)) for r in registrations() if r.config_model().smoke},
}
_PROFILE_PATHS = (
    sorted(_paths(_PROFILE), key=str)
    + [("gan", k) for k in ("z_dim", "betas", "generator_hidden")]
    + [("privacy", "delta"), ("split",), ("evaluation", "penalties"), ("device",), ("extends",), ("workers",)]
    + [("settings_for_every_generator",)]
)
_SCHEMA = yaml.safe_load(CARDIO_SCHEMA.read_text())
_SCHEMA_PATHS = sorted(_paths(_SCHEMA), key=str) + [("columns", "age", "levels"), ("columns", "gender", "bounds")]
_FOLDER = Path(tempfile.mkdtemp(prefix="dpsynth-config-properties-"))
(_FOLDER / "profiles").mkdir()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(_PROFILE_PATHS), value=_values, extra=st.booleans())
def test_any_value_at_any_profile_key_is_a_profile_or_a_config_error(path, value, extra):
    raw = yaml.safe_load(yaml.safe_dump(_PROFILE))
    _replace(raw, path, value)
    if extra:
        raw["gan"] = {**raw["gan"], "seperator": value} if isinstance(raw.get("gan"), dict) else raw.get("gan")
    (_FOLDER / "profiles" / "p.yaml").write_text(yaml.safe_dump(raw))
    try:
        profile = load_profile("p", _FOLDER / "schema.yaml")
    except ConfigError as exc:
        _assert_readable(exc)
        return
    assert not extra or not isinstance(raw.get("gan"), dict)  # an unknown key is never accepted
    assert math.isfinite(profile.privacy.delta) and profile.gan.iterations % profile.gan.checkpoint_every == 0
    plain = profile.to_dict()  # plain data, each generator section under its key, as in the file
    assert isinstance(plain["gan"], dict) and load_profile("p", _FOLDER / "schema.yaml").to_dict() == plain


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(_SCHEMA_PATHS), value=_values)
def test_any_value_at_any_schema_key_is_a_schema_or_a_config_error(path, value):
    raw = yaml.safe_load(yaml.safe_dump(_SCHEMA))
    _replace(raw, path, value)
    schema_file = _FOLDER / "schema.yaml"
    schema_file.write_text(yaml.safe_dump(raw))
    try:
        schema = DatasetSchema.from_yaml(schema_file)
    except ConfigError as exc:
        _assert_readable(exc)
        return
    assert schema.column(schema.target).kind == "binary"
    for column in schema.continuous:
        low, high = column.bounds
        assert math.isfinite(low) and math.isfinite(high) and low < high
    for column in schema.discrete:
        assert len(set(column.levels)) == len(column.levels) >= 2


@settings(max_examples=40, deadline=None)
@given(document=_values)
def test_any_yaml_document_is_a_schema_or_a_config_error(document):
    try:
        DatasetSchema.from_dict(document, origin="schema 'fuzz'")
    except ConfigError as exc:
        _assert_readable(exc)


@pytest.mark.parametrize(
    "loc, path",
    [
        (("gan", "betas", 0), "gan.betas[0]"),
        (("columns", "blood pressure", "bounds"), "columns.'blood pressure'.bounds"),
        (("\n",), "'\\n'"),
        (("",), "''"),
    ],
)
def test_key_paths_stay_on_one_readable_line(loc, path):
    assert dotted(loc) == path
