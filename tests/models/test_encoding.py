import numpy as np
import pandas as pd

from dpsynth.models.data.encoding import TableEncoder
from dpsynth.models.data.preprocessing import typed_frame


def test_round_trip_is_exact_on_valid_rows(cardio_schema, demo_frame):
    enc = TableEncoder(cardio_schema)
    table = typed_frame(cardio_schema, demo_frame[cardio_schema.column_names])
    encoded = enc.encode(table)
    assert encoded.shape == (len(table), 16)
    assert encoded.min() >= -1 and encoded.max() <= 1
    decoded = enc.decode(encoded)
    pd.testing.assert_frame_equal(decoded, table.reset_index(drop=True), check_dtype=False)
    assert list(decoded.columns) == cardio_schema.column_names


def test_decoder_maps_any_output_to_valid_rows(cardio_schema):
    enc = TableEncoder(cardio_schema)
    noise = np.random.default_rng(0).normal(0, 3, size=(500, enc.width))
    decoded = enc.decode(noise)
    for col in cardio_schema.columns:
        if col.kind == "continuous":
            assert decoded[col.name].between(*col.bounds).all()
            assert np.allclose(decoded[col.name], decoded[col.name].round(col.decimals))
        else:
            assert set(decoded[col.name]).issubset(set(col.levels))
    assert decoded["age"].dtype == np.int64 and decoded["weight"].dtype == np.float64


def test_encoding_uses_schema_bounds_not_data(cardio_schema, demo_frame):
    """Shifting the data's min/max leaves the encoding of a fixed row unchanged."""
    enc = TableEncoder(cardio_schema)
    table = typed_frame(cardio_schema, demo_frame[cardio_schema.column_names])
    row = table.iloc[[0]]
    narrow = table[(table["height"] > 150) & (table["height"] < 180)]
    assert np.array_equal(enc.encode(row), enc.encode(pd.concat([row, narrow]))[:1])
    low, high = cardio_schema.column("height").bounds
    assert enc.encode(row.assign(height=low))[0, enc.block("height").start] == -1.0
    assert enc.encode(row.assign(height=high))[0, enc.block("height").start] == 1.0


def test_one_hot_and_binary_layout(cardio_schema):
    enc = TableEncoder(cardio_schema)
    block = enc.block("cholesterol")
    assert block.stop - block.start == 3
    assert enc.encoded_names()[block.start : block.stop] == ["cholesterol=1", "cholesterol=2", "cholesterol=3"]
    assert len(enc.feature_indices) == 15 and enc.target_index not in enc.feature_indices
