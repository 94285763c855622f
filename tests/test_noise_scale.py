"""The gradient noise scale from micro-batches, against per-example NumPy gradients."""

import keras
import numpy as np
import pytest

import kadapt
from kadapt.batching.noise_scale import NoiseScale

ROWS, FEATURES = 4096, 4


def _regression(noise):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    y = (x @ np.array([[3.0], [-2.0], [1.0], [0.5]]) + noise * rng.normal(size=(ROWS, 1))).astype("float32")
    return x, y


def _true_noise_scale(x, y):
    """B_simple = tr(Sigma) / |G|^2 over the per-example gradients of
    (x.w - y)^2 at w = 1 (the model's fixed weights: the learning rate is 0)."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    per_example = 2.0 * (x @ np.ones((FEATURES, 1)) - y) * x
    mean = per_example.mean(axis=0)
    trace = ((per_example - mean) ** 2).sum(axis=1).mean()
    return trace / (mean @ mean)


def _model(micro_batch_size):
    inputs = keras.Input((FEATURES,))
    outputs = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(inputs)
    model = kadapt.AccumulatingModel(inputs, outputs, micro_batch_size=micro_batch_size, measure_noise=True)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    return model


@pytest.mark.parametrize("noise, micro_batch_size", [(1.0, 16), (4.0, 8), (4.0, 10)], ids=["clean", "noisy", "ragged"])
def test_converges_to_the_true_noise_scale(noise, micro_batch_size):
    x, y = _regression(noise)
    truth = _true_noise_scale(x, y)
    model = _model(micro_batch_size)
    # A longer horizon than the default 0.99: with it the estimate still
    # wanders by about +-10% around the truth on this small problem.
    model.noise_scale.decay = 0.995
    history = model.fit(x, y, batch_size=64, epochs=10, verbose=0, shuffle=True)
    logged = history.history["noise_scale"][-1]
    assert logged == pytest.approx(truth, rel=0.10)


def test_closed_form_of_one_update():
    # a = 4, b = 3, u = 1/2, v = 1/4: tr(Sigma) = (4 - 3) / (1/4) = 4 and
    # |G|^2 = (3/2 - 4/4) / (1/4) = 2, so B_simple = 2.
    metric = NoiseScale(decay=0.0)
    metric.update_state(a=4.0, b=3.0, u=0.5, v=0.25)
    assert float(metric.trace.numpy()) == pytest.approx(4.0)
    assert float(metric.squared_norm.numpy()) == pytest.approx(2.0)
    assert float(metric.result().numpy()) == pytest.approx(2.0)
    metric.update_state(a=9.0, b=1.0, u=0.5, v=0.5)  # one micro-batch: ignored
    assert float(metric.result().numpy()) == pytest.approx(2.0)
    metric.reset_state()  # Keras' per-epoch reset keeps the average
    assert float(metric.result().numpy()) == pytest.approx(2.0)


def test_needs_two_micro_batches():
    x, y = _regression(1.0)
    with pytest.raises(ValueError, match=r"needs at least 2 micro-batches per step.*micro_batch_size=16.*Received: batch_size=16"):
        _model(16).fit(x, y, batch_size=16, verbose=0)
    with pytest.raises(TypeError, match=r"`measure_noise` must be a bool. Received: measure_noise='yes'"):
        kadapt.accumulate(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), 4, measure_noise="yes")
