"""Demo tables: conformant to any schema, deterministic, with a learnable target."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth.models.data.demo import make_demo_table
from dpsynth.models.data.schema import DatasetSchema
from dpsynth.models.errors import ConfigError

CARDIO_YAML = Path(__file__).resolve().parents[2] / "configs" / "cardio.yaml"


@pytest.fixture(scope="module")
def schema() -> DatasetSchema:
    return DatasetSchema.from_yaml(CARDIO_YAML)


def test_conforms_to_schema(schema):
    df = make_demo_table(schema, 2000, seed=1)
    assert list(df.columns) == [schema.id_column, *schema.column_names]
    assert df[schema.id_column].tolist() == list(range(2000))
    assert not df.isna().any().any()
    for column in schema.columns:
        values = df[column.name]
        if column.is_continuous:
            low, high = column.bounds
            assert values.between(low, high).all(), column.name
            assert np.allclose(values, values.round(column.decimals))
            assert values.nunique() > 20
        else:
            assert set(values.unique()) == set(column.levels), column.name


def test_deterministic_for_a_seed(schema):
    pd.testing.assert_frame_equal(make_demo_table(schema, 300, seed=7), make_demo_table(schema, 300, seed=7))
    assert not make_demo_table(schema, 300, seed=7).equals(make_demo_table(schema, 300, seed=8))


def test_target_is_learnable(schema):
    df = make_demo_table(schema, 4000, seed=2)
    y = df[schema.target].to_numpy()
    assert 0.3 < y.mean() < 0.7
    # The target depends on at least two continuous columns: each alone ranks it better than chance.
    strong = [c.name for c in schema.continuous if abs(_auc(df[c.name].to_numpy(), y) - 0.5) > 0.1]
    assert len(strong) >= 2
    # A least-squares linear score on all features separates the classes clearly.
    X = df[schema.column_names].drop(columns=[schema.target]).to_numpy(dtype=float)
    X = (X - X.mean(0)) / X.std(0)
    X = np.column_stack([X, np.ones(len(X))])
    train, test = slice(0, 3000), slice(3000, None)
    w, *_ = np.linalg.lstsq(X[train], y[train], rcond=None)
    assert _auc(X[test] @ w, y[test]) > 0.7


def test_generic_schema_without_id_and_with_text_levels():
    schema = DatasetSchema.from_dict(
        {
            "name": "toy",
            "target": "label",
            "columns": {
                "a": {"type": "continuous", "bounds": [0.5, 9.5], "decimals": 0},
                "b": {"type": "continuous", "bounds": [-1, 1], "decimals": 2},
                "kind": {"type": "categorical", "levels": ["x", "y", "z", "w"]},
                "label": {"type": "binary", "levels": ["neg", "pos"]},
            },
        }
    )
    df = make_demo_table(schema, 500, seed=0)
    assert list(df.columns) == ["a", "b", "kind", "label"]
    assert df["a"].between(0.5, 9.5).all() and df["a"].dtype == np.int64
    assert set(df["kind"]) == {"x", "y", "z", "w"} and set(df["label"]) == {"neg", "pos"}
    with pytest.raises(ValueError):
        make_demo_table(schema, 0, seed=0)


def _auc(score: np.ndarray, y: np.ndarray) -> float:
    """Rank-based AUC (Mann-Whitney U), ties averaged."""
    ranks = pd.Series(score).rank().to_numpy()
    pos = y == y.max()
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return (ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def test_hard_shape_makes_the_harder_table_of_the_utility_study():
    """configs/census-demo.yaml with --shape hard: a 40+ level column with rare levels and an explicit
    "unknown", columns mostly at their lower bound with long tails, a 25/75 target that depends on them."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from dpsynth.models.data.demo import SHAPES
    from dpsynth.models.data.encoding import TableEncoder
    from dpsynth.tasks.validate import check_table

    census = DatasetSchema.from_yaml(CARDIO_YAML.parent / "census-demo.yaml")
    table = make_demo_table(census, 20000, seed=5, shape=SHAPES["hard"])
    assert check_table(census, table).passed
    widest = max((c for c in census.columns if not c.is_continuous), key=lambda c: len(c.levels))
    shares = table[widest.name].value_counts(normalize=True)
    assert len(widest.levels) >= 40 and "unknown" in widest.levels and (shares < 0.01).sum() >= 10
    at_zero = [c.name for c in census.columns if c.is_continuous and c.bounds[0] == 0]
    assert at_zero and all(0.85 < (table[name] == 0).mean() < 0.95 for name in at_zero)
    positive = (table[census.target] == census.column(census.target).levels[1]).mean()
    assert abs(positive - 0.25) < 0.02
    encoder = TableEncoder(census)
    encoded = encoder.encode(table)
    x = np.delete(encoded, encoder.target_index, axis=1)
    y = encoded[:, encoder.target_index] > 0
    model = LogisticRegression(max_iter=2000).fit(x[:15000], y[:15000])
    assert roc_auc_score(y[15000:], model.predict_proba(x[15000:])[:, 1]) > 0.75
    # The plain demo is unchanged by the option.
    pd.testing.assert_frame_equal(make_demo_table(census, 50, seed=1), make_demo_table(census, 50, seed=1, shape=None))


def test_measured_shape_rests_a_balanced_target_on_one_narrow_measurement_at_round_numbers(schema):
    """--shape measured: the last two continuous columns are paired, narrow and mostly on a grid of 1/18 of
    their bounds; the target is balanced and a classifier learns it mostly from the first of them."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from dpsynth.models.data.demo import SHAPES
    from dpsynth.models.data.encoding import TableEncoder
    from dpsynth.tasks.validate import check_table

    table = make_demo_table(schema, 20000, seed=5, shape=SHAPES["measured"])
    assert check_table(schema, table).passed
    pd.testing.assert_frame_equal(table, make_demo_table(schema, 20000, seed=5, shape=SHAPES["measured"]))
    continuous = [c for c in schema.columns if c.is_continuous and c.name != schema.target]
    first, second = continuous[-2], continuous[-1]
    for column in (first, second):
        low, high = column.continuous_bounds
        step = (high - low) / 18
        offset = (table[column.name] - low) % step
        on_grid = np.minimum(offset, step - offset) <= 0.5 * 10.0**-column.decimals + 1e-9  # up to rounding
        assert 0.7 < on_grid.mean() < 0.85  # 70% rounded to the grid, some of the rest on it by chance
        assert table[column.name].std() < 0.12 * (high - low)
    assert table[first.name].corr(table[second.name]) > 0.5
    positive = (table[schema.target] == schema.column(schema.target).levels[1]).mean()
    assert abs(positive - 0.5) < 0.02
    encoder = TableEncoder(schema)
    encoded = encoder.encode(table)
    y = encoded[:, encoder.target_index] > 0
    every = np.delete(encoded, encoder.target_index, axis=1)
    alone = encoded[:, [encoder.block(first.name).start]]
    scores = []
    for x in (every, alone):
        model = LogisticRegression(max_iter=2000).fit(x[:15000], y[:15000])
        scores.append(roc_auc_score(y[15000:], model.predict_proba(x[15000:])[:, 1]))
    assert 0.74 < scores[0] < 0.82 and scores[1] > 0.68  # the one measurement carries most of it
    two_measurements = DatasetSchema.from_dict(
        {
            "name": "toy",
            "target": "label",
            "columns": {
                "a": {"type": "continuous", "bounds": [0, 10], "decimals": 0},
                "b": {"type": "continuous", "bounds": [0, 10], "decimals": 0},
                "kind": {"type": "categorical", "levels": ["x", "y", "z"]},
                "label": {"type": "binary", "levels": ["neg", "pos"]},
            },
        }
    )
    with pytest.raises(ConfigError, match="measured needs three continuous columns"):
        make_demo_table(two_measurements, 10, shape=SHAPES["measured"])


def test_measured_shape_records_a_decimal_column_at_whole_units_in_most_rows(schema):
    """--shape measured: every continuous column declared with decimals (Cardio's weight, one decimal) is
    at whole units in 0.9 of the rows (a few more by chance), a multiple of 5 in about 0.3 of those."""
    from dpsynth.models.data.demo import SHAPES

    table = make_demo_table(schema, 20000, seed=7, shape=SHAPES["measured"])
    decimal = [c for c in schema.columns if c.is_continuous and c.decimals > 0]
    assert [c.name for c in decimal] == ["weight"]
    weight = table["weight"].to_numpy()
    whole = weight == np.rint(weight)
    assert 0.9 <= whole.mean() < 0.93
    assert 0.3 < (weight % 5 == 0).mean() < 0.5
    assert (weight >= 35.0).all() and (weight <= 200.0).all() and (np.round(weight, 1) == weight).all()


def test_heaped_shape_heaps_one_narrow_column_rounds_ages_and_gives_the_weight_a_tail_rising_with_age():
    """configs/census-demo.yaml with --shape heaped: about half the hours at 40 and more at multiples of 5,
    ages heaped at values ending in 0 and 5, a long-tailed survey weight in monotone relation with age,
    the hard shape's point masses and level shares, a learnable 25/75 target."""
    from scipy.stats import spearmanr
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from dpsynth.models.data.demo import SHAPES
    from dpsynth.models.data.encoding import TableEncoder
    from dpsynth.tasks.validate import check_table

    census = DatasetSchema.from_yaml(CARDIO_YAML.parent / "census-demo.yaml")
    table = make_demo_table(census, 20000, seed=5, shape=SHAPES["heaped"])
    assert check_table(census, table).passed
    pd.testing.assert_frame_equal(table, make_demo_table(census, 20000, seed=5, shape=SHAPES["heaped"]))
    hours, age, weight = table["hours_per_week"], table["age"], table["final_weight"]
    assert 0.45 < (hours == 40).mean() < 0.6
    assert (hours % 5 == 0).mean() > (hours == 40).mean() + 0.15 and (hours % 10 == 0).mean() > 0.55
    assert (age % 5 == 0).mean() > 0.5  # a fifth by chance; half are rounded to a 0 or a 5
    assert weight.skew() > 2 and weight.quantile(0.99) > 4 * weight.median()  # a long right tail
    assert spearmanr(age, weight).statistic > 0.8
    assert all(0.85 < (table[name] == 0).mean() < 0.95 for name in ("capital_gain", "capital_loss"))
    positive = (table[census.target] == census.column(census.target).levels[1]).mean()
    assert abs(positive - 0.25) < 0.02
    encoder = TableEncoder(census)
    encoded = encoder.encode(table)
    x = np.delete(encoded, encoder.target_index, axis=1)
    y = encoded[:, encoder.target_index] > 0
    model = LogisticRegression(max_iter=2000).fit(x[:15000], y[:15000])
    assert roc_auc_score(y[15000:], model.predict_proba(x[15000:])[:, 1]) > 0.75


def test_the_heaped_shape_says_what_a_schema_lacks(schema):
    from dpsynth.models.data.demo import SHAPES

    narrow = DatasetSchema.from_dict(
        {
            "name": "toy",
            "target": "label",
            "columns": {
                "a": {"type": "continuous", "bounds": [0, 10], "decimals": 0},
                "b": {"type": "continuous", "bounds": [0, 10], "decimals": 0},
                "kind": {"type": "categorical", "levels": ["x", "y", "z"]},
                "label": {"type": "binary", "levels": ["neg", "pos"]},
            },
        }
    )
    with pytest.raises(ConfigError, match="heaped needs two continuous columns of at most 400 values, a wider"):
        make_demo_table(narrow, 10, shape=SHAPES["heaped"])
