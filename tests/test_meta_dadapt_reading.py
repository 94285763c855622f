"""D-Adaptation's reading of the rate: the estimate on closed-form gradients, its bound on a convex
quadratic, the run on a model against a NumPy oracle, and the heavy ball it stands for, by the weights."""

import keras
import numpy as np
import pytest
from helpers import constant_meta_model

import kadapt
from kadapt.batching.training_state import state_variables
from kadapt.meta import MetaAdjuster
from kadapt.meta import RangeTestStart
from kadapt.meta import Trigger
from kadapt.meta.actions import KEEP
from kadapt.meta.dadapt_reading import DAdaptation
from kadapt.meta.dadapt_reading import read_dadapt_rate

pytestmark = pytest.mark.backends("tensorflow", "jax")

ROWS, BATCH, STEPS = 64, 16, 30
TARGET = np.array([1.0, -2.0, 0.5])


def data():
    x = np.random.default_rng(0).normal(size=(ROWS, 3)).astype("float32")
    return x, (x @ TARGET[:, None]).astype("float32")


def linear_model(learning_rate=0.01, momentum=0.5):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        1, use_bias=False, kernel_initializer=keras.initializers.Constant(0.2))])
    model.compile(optimizer=kadapt.optimizers.SGD(learning_rate, momentum=momentum), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def mse_gradient(w, x, y):
    """The gradient of Keras' mean squared error of x @ w against y, in closed form."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)[:, 0]
    return 2 / len(x) * x.T @ (x @ w - y)


def test_three_steps_on_a_parabola_by_hand():
    # f = (x - 3)^2 / 2 from 0, d0 = 0.3: ||g0|| = 3, lambda = d / 3 = 0.1 while d stays 0.3.
    # s = -0.3, -0.57, -0.813; sum lambda^2 g^2 = 0.09, 0.1629, 0.221949;
    # d_hat = (s^2 - that) / |s| = 0, 0.2842, 0.54: d = 0.3, 0.3, 0.54.
    estimate, x, points, ds = DAdaptation([0.0], d0=0.3), 0.0, [], []
    for _ in range(3):
        x = float(estimate.step([x - 3.0])[0])
        points.append(x)
        ds.append(estimate.d)
    assert points == pytest.approx([0.3, 0.57, 0.813], abs=1e-12)
    assert ds == pytest.approx([0.3, 0.3, 0.54], abs=1e-12)
    assert estimate.rate() == pytest.approx(0.18)  # 0.54 / 3, momentum 0


def test_on_a_convex_quadratic_the_bound_stays_below_the_distance_and_nears_it():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(20, 20))
    hessian, solution = a.T @ a / 20 + 0.1 * np.eye(20), rng.normal(size=20) * 3
    distance = np.linalg.norm(solution)  # from x0 = 0
    estimate, bounds = DAdaptation(np.zeros(20)), []
    x = estimate.x
    for _ in range(60):
        x = estimate.step(hessian @ (x - solution))
        bounds.append(estimate.lower_bound)
    assert max(bounds) <= distance and estimate.d <= 2 * distance
    assert max(bounds) > 0.3 * distance  # from d0 = 1e-6 in 60 steps


def test_the_averaging_is_the_heavy_ball_at_the_rate_read():
    # x_{k+1} - x_k = beta (x_k - x_{k-1}) - (1 - beta) lambda_k g_k: kadapt's SGD with that rate at
    # each step, fit on the same batch, trains the same weights as the estimate's points.
    x, y = data()
    model = linear_model(momentum=0.9)
    estimate = DAdaptation(np.full(3, 0.2), momentum=0.9)
    for _ in range(STEPS):
        gradient = mse_gradient(estimate.x, x[:BATCH], y[:BATCH])
        if estimate.gradient_norm is None:
            rate = (1 - 0.9) * estimate.d / np.linalg.norm(gradient)
        else:
            rate = estimate.rate()
        model.optimizer.learning_rate.assign(rate)
        model.train_on_batch(x[:BATCH], y[:BATCH])
        estimate.step(gradient)
    np.testing.assert_allclose(model.get_weights()[0][:, 0], estimate.x, rtol=1e-4)
    assert estimate.d > 1e-3  # it moved: the comparison is not of two points at x0


def test_a_reading_on_a_model_matches_the_oracle_and_leaves_the_model_as_it_was():
    x, y = data()
    model = linear_model(momentum=0.5)
    before = [np.array(v.numpy()) for v in state_variables(model)]
    reading = read_dadapt_rate(model, iter([(x[:BATCH], y[:BATCH])] * STEPS), STEPS)
    oracle = DAdaptation(np.full(3, 0.2), momentum=0.5)
    for _ in range(STEPS):
        oracle.step(mse_gradient(oracle.x, x[:BATCH], y[:BATCH]))
    assert reading.steps_run == STEPS and not reading.diverged
    assert reading.suggestion == pytest.approx(oracle.rate(), rel=1e-4)
    assert reading.d == pytest.approx(oracle.d, rel=1e-4) and reading.d > 0.1
    for value, variable in zip(before, state_variables(model), strict=True):
        np.testing.assert_array_equal(value, variable.numpy())  # weights, velocities, momentum, iterations


def test_a_reading_stops_where_the_loss_diverges_and_reads_the_estimate_before():
    # One input scaled 3x: D-Adaptation's steps (momentum 0) overshoot it and the loss blows up.
    x, _ = data()
    y = (x @ TARGET[:, None]).astype("float32")
    x = x * np.array([3.0, 1.0, 0.1], "float32")
    model = linear_model(momentum=0.0)
    reading = read_dadapt_rate(model, iter([(x[:BATCH], y[:BATCH])] * 60), 60)
    # The oracle: closed-form loss and gradient, the range test's stop written out (beta 1 - 2/60).
    beta, average, best = 1 - 2 / 60, 0.0, np.inf
    oracle, losses = DAdaptation(np.full(3, 0.2)), []
    for step in range(1, 61):
        residual = x[:BATCH].astype(np.float64) @ oracle.x - y[:BATCH, 0]
        average = beta * average + (1 - beta) * np.mean(residual**2)
        best = min(best, average / (1 - beta**step))
        if average / (1 - beta**step) > 4 * best:
            break
        losses.append(np.mean(residual**2))
        oracle.step(mse_gradient(oracle.x, x[:BATCH], y[:BATCH]))
    assert reading.diverged and reading.steps_run == len(losses) < 60
    assert reading.suggestion == pytest.approx(oracle.rate(), rel=1e-4)
    np.testing.assert_allclose(reading.losses, losses, rtol=1e-4)


def test_a_judged_start_reading_dadapt_logs_the_reading_it_branched_on():
    x, y = data()
    model = linear_model(1e-4)
    start = RangeTestStart(x, y, batch_size=8, max_steps=16, seed=0, reading="dadapt")
    adjuster = MetaAdjuster(constant_meta_model(KEEP), monitor="loss", verbose=0, range_test=start,
                            trigger=Trigger(patience=10**9, cooldown=0, explode_factor=1e300))
    expected = start.run(linear_model(1e-4), 16)
    model.fit(x, y, batch_size=8, epochs=10, shuffle=False, verbose=0, callbacks=[adjuster])
    (decision,) = adjuster.decisions
    detail = decision["range_test"]
    assert detail["reading"] == "dadapt" and detail["steps_run"] == 16
    assert detail["suggestion"] == pytest.approx(expected.suggestion, rel=1e-6)
    assert [b["learning_rate"] for b in detail["branches"]][:2] == pytest.approx([1e-4, expected.suggestion])


def test_bad_arguments():
    x, y = data()
    with pytest.raises(ValueError, match=r"Argument `reading` must be one of .* Received: reading='valley'"):
        RangeTestStart(x, y, reading="valley")
    adam = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    adam.compile(optimizer="adam", loss="mse")
    with pytest.raises(TypeError, match="needs an SGD optimizer .* Received: optimizer=Adam"):
        read_dadapt_rate(adam, iter([(x, y)]), 1)
    keras_sgd = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    keras_sgd.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    with pytest.raises(TypeError, match=r"set to 0 .* Received: keras.optimizers.SGD\(momentum=0.9"):
        read_dadapt_rate(keras_sgd, iter([(x, y)]), 1)
    with pytest.raises(ValueError, match="must hold at least num_steps=5 batches: it ran out after 2"):
        read_dadapt_rate(linear_model(), iter([(x, y)] * 2), 5)
    with pytest.raises(ValueError, match="first gradient must be finite and non-zero"):
        DAdaptation([1.0]).step([0.0])
