"""`kadapt.models.table_mlp`: a table's numbers also enter the MLP as quantile pieces."""

import keras
import numpy as np
import pytest

from kadapt.models.table_mlp import network_text
from kadapt.models.table_mlp import quantile_pieces
from kadapt.models.table_mlp import table_mlp

pytestmark = pytest.mark.backends("tensorflow", "jax")


def _rows(n=400):
    rng = np.random.default_rng(0)
    return np.stack([rng.lognormal(size=n),  # skewed
                     rng.integers(0, 2, n),  # a flag: nothing to cut
                     np.full(n, 3.0),  # one value: nothing to cut
                     rng.integers(0, 3, n),  # three values: two pieces
                     rng.normal(size=n)], axis=1).astype("float32")


def test_the_pieces_rebuild_each_value_clipped_to_the_training_range():
    x = _rows()
    pieces = quantile_pieces(x)
    probe = np.concatenate([x, x * 3 - 2])  # values beyond the training range too
    values = keras.ops.convert_to_numpy(pieces(keras.ops.convert_to_tensor(probe)))
    for column in (0, 3, 4):
        mine = pieces.columns == column
        low, high = x[:, column].min(), x[:, column].max()
        rebuilt = low + values[:, mine] @ pieces.span[mine]
        np.testing.assert_allclose(rebuilt, np.clip(probe[:, column], low, high), rtol=1e-5, atol=1e-5)
    assert set(pieces.columns) == {0, 3, 4}


def test_the_edges_are_the_training_quantiles():
    x = _rows()
    pieces = quantile_pieces(x, bins=8)
    for column in (0, 4):
        expected = np.quantile(x[:, column].astype("float64"), np.linspace(0, 1, 9))
        mine = pieces.columns == column
        edges = np.append(pieces.left[mine], pieces.left[mine][-1] + pieces.span[mine][-1])
        np.testing.assert_allclose(edges, expected, rtol=1e-6)
    np.testing.assert_array_equal(pieces.left[pieces.columns == 3], [0, 1])


def test_few_rows_get_fewer_bins_and_too_few_none():
    x = _rows(60)  # 3 columns to cut: 60 // (2 * 3) = 10 bins
    assert quantile_pieces(x).bins == 10
    assert quantile_pieces(x, rows=10).columns.size == 0  # 10 // 6 = 1 bin: no pieces
    assert quantile_pieces(x, rows=6000).bins == 16  # a sample of more rows


def test_the_network_names_what_it_made_and_a_plain_mlp_says_nothing():
    model = table_mlp(_rows(), 3)
    assert model.output.shape[-1] == 3
    assert network_text(model) == "mlp: its 5 inputs and 34 quantile pieces of the numeric ones (piecewise linear)"
    inputs = keras.Input((5,))
    assert network_text(keras.Model(inputs, keras.layers.Dense(3)(inputs))) is None
