"""`kadapt.meta.model.numpy_forward`: the meta-model's forward pass in NumPy equals Keras' own output."""

import keras
import numpy as np
import pytest

from kadapt.meta import load_meta_model
from kadapt.meta.live.policy import model_predictor
from kadapt.meta.model import actions as action_lib
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.model.features import WINDOW
from kadapt.meta.model.meta_model import MetaSpec
from kadapt.meta.model.meta_model import predicted_differences
from kadapt.meta.model.numpy_forward import numpy_forward

pytestmark = pytest.mark.backends("tensorflow", "jax")


def _windows(count=5):
    return np.random.default_rng(1).normal(size=(count, WINDOW, len(FEATURE_NAMES))).astype("float32")


def _meta_model(cell, layers, **cell_kwargs):
    """As `MetaHyperModel` builds one, with random (not trained-looking) weights."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((WINDOW, len(FEATURE_NAMES)))
    hidden = MetaSpec()(inputs)
    for index in range(layers):
        hidden = cell(8, return_sequences=index < layers - 1, bias_initializer="random_normal",
                      **cell_kwargs)(hidden)
    hidden = keras.layers.Dropout(0.3)(hidden)
    return keras.Model(inputs, keras.layers.Dense(len(action_lib.ACTIONS))(hidden))


@pytest.mark.parametrize("cell, layers, kwargs", [
    (keras.layers.GRU, 1, {}), (keras.layers.GRU, 2, {}), (keras.layers.GRU, 1, {"reset_after": False}),
    (keras.layers.LSTM, 1, {}), (keras.layers.LSTM, 2, {}),
], ids=["gru", "gru2", "gru_reset_before", "lstm", "lstm2"])
def test_equals_the_keras_call(cell, layers, kwargs):
    model = _meta_model(cell, layers, **kwargs)
    windows = _windows()
    expected = keras.ops.convert_to_numpy(model(windows, training=False))
    np.testing.assert_allclose(numpy_forward(model)(windows), expected, rtol=1e-5, atol=1e-5)


def test_the_default_meta_models_predictions():
    meta_model = load_meta_model("default")
    windows = _windows(3)
    predict = model_predictor(meta_model)
    expected = predicted_differences(meta_model, windows)
    for window, row in zip(windows, expected, strict=True):
        np.testing.assert_allclose(predict(window), row, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head", ["relu", "conv"])
def test_other_models_are_left_to_keras(head):
    model = _meta_model(keras.layers.GRU, 1)
    if head == "relu":
        model = keras.Sequential([model, keras.layers.Dense(len(action_lib.ACTIONS), activation="relu")])
    else:
        inputs = keras.Input((WINDOW, len(FEATURE_NAMES)))
        hidden = keras.layers.Conv1D(4, 3)(MetaSpec()(inputs))
        model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.GRU(4)(hidden)))
    assert numpy_forward(model) is None
