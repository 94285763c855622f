"""The learning-rate range test: the sweep against gradient descent on a
quadratic in closed form, the restored state, and the rules on hand-made curves."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import kadapt
from kadapt.range_test import curve

# A batch of 2 rows whose covariance C = X^T X / 2 = diag(4, 1).
INPUTS = np.sqrt(2.0) * np.array([[2.0, 0.0], [0.0, 1.0]], dtype="float32")
TARGET_WEIGHTS = np.array([[1.0], [1.0]], dtype="float32")
STABLE_LIMIT = 0.25  # 2 / lambda_max(H), H = 2 C = diag(8, 2): see the quadratic test


def _quadratic(optimizer, accumulate=False):
    """A 1-unit Dense without bias, weights 0, on mean squared error."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    if accumulate:
        model = kadapt.accumulate(model, micro_batch_size=1)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _same_batch_forever():
    return itertools.repeat((INPUTS, INPUTS @ TARGET_WEIGHTS))


def _gradient_descent_losses(rates):
    """NumPy: the loss before each step of w <- w - rate * 2 C (w - w*)."""
    covariance = INPUTS.T.astype(np.float64) @ INPUTS / len(INPUTS)
    error, losses = -TARGET_WEIGHTS.astype(np.float64), []
    for rate in rates:
        losses.append((error.T @ covariance @ error).item())
        error = error - rate * 2.0 * covariance @ error
    return np.array(losses)


@pytest.mark.parametrize("case", ["float rate", "schedule", "accumulating, kadapt SGD, schedule"])
def test_sweep_is_gradient_descent_and_stops_past_the_stable_limit(case):
    """Mean squared error of a linear model w on inputs of covariance C is
    L(w) = (w - w*)^T C (w - w*), Hessian H = 2 C, eigenvalues 8 and 2. SGD
    maps the error e to (I - r H) e: each component shrinks while
    |1 - r lambda| < 1 for every eigenvalue, i.e. for r < 2 / lambda_max = 0.25,
    so the loss falls at every step below that rate and the test cannot stop
    there; past it the top component grows by |1 - 8 r| > 1 a step, and by the
    rate 4 / lambda_max (0.5, |1 - 8 r| = 3) the loss grows ninefold a step.
    The losses equal NumPy's gradient descent at the swept rates whatever
    holds the rate (the schedule is swapped out; micro-batches of 1 row
    average to the batch's gradient)."""
    schedule = keras.optimizers.schedules.CosineDecay(0.05, decay_steps=1000)
    optimizer = {
        "float rate": keras.optimizers.SGD(0.05),
        "schedule": keras.optimizers.SGD(schedule),
        "accumulating, kadapt SGD, schedule": kadapt.optimizers.SGD(schedule, learning_rate_multiplier=3.0),
    }[case]
    model = _quadratic(optimizer, accumulate=case.startswith("accumulating"))

    result = kadapt.find_learning_rate(model, _same_batch_forever(), start=1e-4, stop=10.0, num_steps=60)

    rates, losses = np.array(result.rates), np.array(result.losses)
    expected = _gradient_descent_losses(rates)
    # Tight below r = 0.1; near r = 1/8 the top component is wiped out
    # (|1 - 8 r| ~ 0) down to float32 rounding, which the rise past the
    # limit then amplifies.
    early = rates < 0.1
    np.testing.assert_allclose(losses[early], expected[early], rtol=1e-5)
    np.testing.assert_allclose(losses, expected, rtol=0.05, atol=1e-6)
    assert np.all(np.diff(losses)[rates[:-1] < STABLE_LIMIT] < 0)
    # The loss at the last step is the first that can rise: the update before
    # it used a rate past the limit, one grid step below the last rate.
    assert result.diverged and rates[-2] > STABLE_LIMIT
    assert result.suggestion < STABLE_LIMIT


def test_schedule_is_back_in_the_next_step():
    """A step, the test, a step: the second applies the schedule at the
    restored iteration 1. With w0 = 0, s(t) = 0.05 (1 + cos(pi t / 4)) / 2:
    w1 = s(0) 2 C w*, w2 = w1 - s(1) 2 C (w1 - w*)."""
    schedule = keras.optimizers.schedules.CosineDecay(0.05, decay_steps=4)
    model = _quadratic(keras.optimizers.SGD(schedule))
    model.train_on_batch(INPUTS, INPUTS @ TARGET_WEIGHTS)
    kadapt.find_learning_rate(model, _same_batch_forever(), start=1e-4, stop=10.0, num_steps=60)

    model.train_on_batch(INPUTS, INPUTS @ TARGET_WEIGHTS)

    gradient = 2.0 * INPUTS.T.astype(np.float64) @ INPUTS / len(INPUTS)
    rate = [0.05 * (1 + np.cos(np.pi * step / 4)) / 2 for step in (0, 1)]
    first = rate[0] * gradient @ TARGET_WEIGHTS
    expected = first - rate[1] * gradient @ (first - TARGET_WEIGHTS)
    np.testing.assert_allclose(model.get_weights()[0], expected, rtol=1e-6)
    assert int(model.optimizer.iterations.numpy()) == 2


def test_state_is_restored_exactly():
    keras.utils.set_random_seed(1)
    x = np.random.default_rng(0).normal(size=(256, 3)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5]], dtype="float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(1e-3, momentum=0.9), loss="mse", metrics=["mae"])
    for rows in (slice(0, 16), slice(16, 32)):
        model.train_on_batch(x[rows], y[rows])
    before = [v.numpy().copy() for v in model.variables + model.optimizer.variables + model.metrics_variables]

    result = kadapt.find_learning_rate(model, x, y, batch_size=16, start=1e-3, stop=1.0, num_steps=16,
                                       shuffle=False)

    after = [v.numpy() for v in model.variables + model.optimizer.variables + model.metrics_variables]
    assert result.steps_run > 0 and len(after) == len(before)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert int(model.optimizer.iterations.numpy()) == 2


def test_rules_on_hand_made_curves():
    rates = 10.0 ** np.arange(14)
    # The longest strictly decreasing run is 10, 9, ..., 2, 1.5 (indices 3-12,
    # 10 points); fastai counts it from 12 - 10 = 2, two thirds down is
    # 2 + int(10 / 3) + int(10 / 6) = 6.
    losses = np.array([1, 1, 1, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1.5, 20], dtype=float)
    assert curve.valley(rates, losses) == (1e6, 6)
    # One decade per point: the gradient is the central difference
    # [-1, -1.5, -1.25, -0.5]; steepest at index 1.
    assert curve.steepest(rates[:4], np.array([4.0, 3.0, 1.0, 0.5])) == (10.0, 1)
    assert curve.minimum_over_ten(rates[:4], np.array([3.0, 2.0, 1.0, 2.0])) == (10.0, 2)
    # beta 0.5: averages 0.5, 1.25; debiased by 1 - 0.5 and 1 - 0.25.
    np.testing.assert_allclose(curve.smooth([1.0, 2.0], 0.5), [1.0, 1.25 / 0.75])
    np.testing.assert_allclose(curve.sweep_rates(1e-3, 10.0, 5), [1e-3, 1e-2, 1e-1, 1.0, 10.0])


def test_a_curve_that_never_falls_suggests_nothing():
    # Points 2 to 14 are read (20 // 10 skipped, 5 dropped at the end): the
    # first is 2 + 2 / 19, at the rate 1e-3 * 1000 ** (2 / 19).
    rates = curve.sweep_rates(1e-3, 1.0, 20)
    with pytest.raises(ValueError, match=r"never fell below its first value 2.105 at rates 0.00207 to 0.162"):
        curve.suggest(rates, np.linspace(2.0, 3.0, 20), "valley", num_steps=20)


@pytest.mark.parametrize("arguments, error, message", [
    ({"start": 1.0, "stop": 1.0}, ValueError, r"`stop` must be above `start`. Received: start=1.0, stop=1.0"),
    ({"rule": "fastest"}, ValueError, r"`rule` must be one of \['minimum/10', 'steepest', 'valley'\]"),
    ({"num_steps": 5}, ValueError, r"`num_steps` must be in \[10, None\]"),
    ({"x": np.zeros((64, 2)), "y": np.zeros((64, 1)), "batch_size": 32}, ValueError,
     r"at least num_steps=100 batches .* Received: x with 2 batches. Pass num_steps=2 \(at least 10\), "
     r"or more rows."),
    ({"x": np.zeros((640, 2)), "y": np.zeros((640, 1)), "batch_size": 64, "num_steps": 20}, ValueError,
     r"Received: x with 10 batches. Pass num_steps=10 \(at least 10\), batch_size=32 or less, or more rows."),
    ({"x": itertools.repeat((INPUTS, INPUTS), 12)}, ValueError, r"it ran out after 12. Pass num_steps=12"),
    ({"x": tf.data.Dataset.from_tensors((INPUTS, INPUTS[:, :1])).repeat(12)}, ValueError,
     r"Received: x with 12 batches. Pass num_steps=12 \(at least 10\), or batches that repeat"),
    ({"x": _same_batch_forever(), "batch_size": 2}, ValueError, r"`batch_size` must be None when `x` is a dataset"),
])
def test_bad_arguments(arguments, error, message):
    model = _quadratic(keras.optimizers.SGD(0.01))
    arguments = {"x": _same_batch_forever(), **arguments}
    with pytest.raises(error, match=message):
        kadapt.find_learning_rate(model, **arguments)


def test_an_uncompiled_model_is_refused():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"`model` must be a compiled `keras.Model`.*Received: model='sequential"):
        kadapt.find_learning_rate(model, _same_batch_forever())
