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


def _reshuffled(x, y, epochs, seed=0):
    """The rows in a new random order for each of `epochs` passes, as one
    array: Keras' `fit(shuffle=True)` repeats the same order every epoch once
    `keras.utils.set_random_seed` was called, and the estimate would then
    settle on the noise of a fixed set of batches."""
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(len(x)) for _ in range(epochs)])
    return x[order], y[order]


def _model(micro_batch_size, features=FEATURES):
    inputs = keras.Input((features,))
    outputs = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(inputs)
    model = kadapt.AccumulatingModel(inputs, outputs, micro_batch_size=micro_batch_size, measure_noise=True)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    return model


@pytest.mark.parametrize("noise, micro_batch_size", [(1.0, 16), (4.0, 8), (4.0, 10)], ids=["clean", "noisy", "ragged"])
def test_converges_to_the_true_noise_scale(noise, micro_batch_size):
    x, y = _regression(noise)
    truth = _true_noise_scale(x, y)
    model = _model(micro_batch_size)
    history = model.fit(*_reshuffled(x, y, 10), batch_size=64, verbose=0, shuffle=False)
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


def test_squared_norm_error_is_the_spread_of_the_average():
    # Steps whose |G|^2 estimates are i.i.d. N(5, 2^2) (u = 1, v = 0 makes
    # the estimate b). The EMA of 1000 steps at decay 0.98 is a weighted mean
    # with sum of weights S1 and of squared weights S2 (closed form), so its
    # standard error in the EMA's own units is 2 * sqrt(S2).
    decay, steps = 0.98, 1000
    rng = np.random.default_rng(0)
    metric = NoiseScale(decay=decay)
    assert float(metric.squared_norm_error().numpy()) == 0.0
    metric.update_state(a=6.0, b=5.0, u=1.0, v=0.0)
    assert float(metric.squared_norm_error().numpy()) == 0.0  # one step: no spread yet
    metric.clear()
    for estimate in rng.normal(5.0, 2.0, size=steps):
        metric.update_state(a=estimate + 1.0, b=estimate, u=1.0, v=0.0)
    weights = (1 - decay) * decay ** np.arange(steps)
    assert float(metric.squared_norm.numpy()) / weights.sum() == pytest.approx(5.0, abs=1.0)
    assert float(metric.squared_norm_error().numpy()) == pytest.approx(2.0 * np.sqrt((weights**2).sum()), rel=0.2)
    metric.clear()
    assert float(metric.squared_norm_error().numpy()) == 0.0


def test_needs_two_micro_batches():
    x, y = _regression(1.0)
    with pytest.raises(ValueError, match=r"needs at least 2 micro-batches per step.*micro_batch_size=16.*Received: batch_size=16"):
        _model(16).fit(x, y, batch_size=16, verbose=0)
    with pytest.raises(TypeError, match=r"`measure_noise` must be a bool. Received: measure_noise='yes'"):
        kadapt.accumulate(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), 4, measure_noise="yes")


# Adam: per feature, scale s and distance c = s (1 - w_true) of the weight
# from the model's fixed 1. Coordinate j then has noise-to-signal R / c_j^2,
# R the mean squared residual, while the plain gradient weighs the
# coordinates by s_j^2: the two noise scales differ by 2.2x.
SCALES = np.array([0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 4.0])
DISTANCES = np.array([1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0])


def _scaled_regression():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, len(SCALES))) * SCALES
    y = x @ (1.0 - DISTANCES / SCALES)[:, None] + rng.normal(size=(ROWS, 1))
    return x.astype("float32"), y.astype("float32")


def _per_example_moments(x, y):
    x, y = x.astype(np.float64), y.astype(np.float64)
    per_example = 2.0 * (x @ np.ones((x.shape[1], 1)) - y) * x  # d/dw of (x.w - y)^2 at w = 1
    mean = per_example.mean(axis=0)
    return mean, ((per_example - mean) ** 2).mean(axis=0)


def _true_preconditioned_noise_scale(x, y, batch_size):
    """tr(P Sigma P) / |P G|^2 for Adam at lr = 0: its bias-corrected second
    moment estimates E[g_B^2] = G^2 + diag(Sigma) / N (N the batch), so
    P^2 = 1 / (G^2 + diag(Sigma) / N), epsilon aside."""
    mean, variance = _per_example_moments(x, y)
    weights = 1.0 / (mean**2 + variance / batch_size)
    return (weights * variance).sum() / (weights * mean**2).sum()


@pytest.mark.parametrize("optimizer", [keras.optimizers.Adam, kadapt.optimizers.Adam], ids=["keras", "kadapt"])
def test_with_adam_converges_to_the_preconditioned_noise_scale(optimizer):
    x, y = _scaled_regression()
    truth = _true_preconditioned_noise_scale(x, y, 64)
    mean, variance = _per_example_moments(x, y)
    assert truth / (variance.sum() / (mean @ mean)) > 2  # not the plain B_simple
    model = _model(16, features=len(SCALES))
    model.compile(optimizer=optimizer(0.0), loss="mse")
    history = model.fit(*_reshuffled(x, y, 10), batch_size=64, verbose=0, shuffle=False)
    assert history.history["noise_scale"][-1] == pytest.approx(truth, rel=0.10)


def test_with_adam_the_first_step_is_not_measured():
    x, y = _scaled_regression()
    model = _model(16, features=len(SCALES))
    model.compile(optimizer=keras.optimizers.Adam(0.0), loss="mse")
    model.fit(x[:64], y[:64], batch_size=64, verbose=0)  # v = 0 before it: P undefined
    assert float(model.noise_scale.trace.numpy()) == 0.0
    model.fit(x[64:128], y[64:128], batch_size=64, verbose=0)
    assert float(model.noise_scale.trace.numpy()) > 0.0
