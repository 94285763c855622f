"""The MetaAdjuster's range-test start, proven by the weights against a run started at the found rate."""

import keras
import numpy as np
import pytest
from helpers import constant_meta_model

import kadapt
from kadapt.meta import MetaAdjuster
from kadapt.meta import RangeTestStart
from kadapt.meta import Trigger
from kadapt.meta.actions import KEEP
from kadapt.meta.features import FEATURE_NAMES
from kadapt.range_test import curve
from kadapt.range_test import find

pytestmark = pytest.mark.backends("tensorflow", "jax")

ROWS, BATCH, EPOCHS, TEST_STEPS = 64, 8, 10, 16  # 80 steps; the test's 16 leave 8 whole epochs


def data(learnable=True):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]])).astype("float32")
    return (x, y) if learnable else (np.zeros_like(x), np.ones_like(y))


def linear_model(learning_rate):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        1, use_bias=False, kernel_initializer=keras.initializers.Constant(0.2))])
    model.compile(optimizer=kadapt.optimizers.SGD(learning_rate, momentum=0.5), loss="mse")
    return model


def silent_adjuster(x, y):
    """Acts only on the range test: its trigger never fires."""
    start = RangeTestStart(x, y, batch_size=BATCH, max_steps=TEST_STEPS, seed=0)
    return MetaAdjuster(constant_meta_model(KEEP), monitor="loss", verbose=0, range_test=start,
                        trigger=Trigger(patience=10**9, cooldown=0, explode_factor=1e300))


def test_a_mis_set_rate_moves_to_the_suggestion_and_trains_as_if_started_there():
    x, y = data()
    model, adjuster = linear_model(1e-5), silent_adjuster(x, y)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[adjuster])
    (decision,) = adjuster.decisions
    suggestion = decision["range_test"]["suggestion"]
    assert decision["trigger"] == "range_test" and decision["range_test"]["steps_run"] == TEST_STEPS
    assert adjuster.get_state()["range_test_steps"] == TEST_STEPS  # a resume counts them, and does not test again
    assert adjuster.get_state()["range_test_rate"] == suggestion  # and the meta-model keeps seeing it
    gap = adjuster.history.window()[-1, FEATURE_NAMES.index("range_test_gap")]
    assert adjuster.history.window()[-1, FEATURE_NAMES.index("range_test_known")] == 1.0
    assert gap == pytest.approx(0.0, abs=1e-6)  # the live rate was moved onto the suggestion
    assert decision["action"] == f"range test: lr x{suggestion / 1e-5:.3g}"
    # The test's steps were charged: fit trained the rest of the 80 steps, the weights restored before.
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * ROWS // BATCH - TEST_STEPS
    reference = linear_model(suggestion)
    reference.fit(x, y, batch_size=BATCH, epochs=EPOCHS - TEST_STEPS * BATCH // ROWS, shuffle=False, verbose=0)
    np.testing.assert_allclose(model.get_weights()[0], reference.get_weights()[0], rtol=1e-5)


def test_a_curve_that_never_falls_keeps_the_rate_and_says_why():
    x, y = data(learnable=False)  # zero inputs, one target: the loss is 1 at every rate
    model, adjuster = linear_model(0.01), silent_adjuster(x, y)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[adjuster])
    (decision,) = adjuster.decisions
    assert decision["action"] == "keep" and "never fell" in decision["range_test"]["why"]
    assert float(model.optimizer.learning_rate_multiplier.numpy()) == 1.0
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * ROWS // BATCH - TEST_STEPS


def test_a_rate_near_the_suggestion_is_kept():
    start = RangeTestStart(np.zeros((4, 1)), np.zeros((4, 1)), factor=3.0)
    assert start.choose(1e-5, 0.01) == 0.01 and start.choose(0.1, 0.01) == 0.01
    assert start.choose(0.02, 0.01) is None and start.choose(0.004, 0.01) is None


def test_the_test_takes_at_most_half_the_budget():
    start = RangeTestStart(np.zeros((4, 1)), np.zeros((4, 1)))
    steps = [start.num_steps(budget) for budget in (80, 1000, None, 19, 20)]
    assert steps == [40, 100, 100, None, find.MIN_STEPS]


def test_short_sweeps_smooth_over_half_their_length():
    assert [curve.sweep_smoothing(n) for n in (4, 10, 40, 100, 400)] == pytest.approx([0.5, 0.8, 0.95, 0.98, 0.98])


@pytest.mark.parametrize("num_steps", [40, 100])
def test_smoothing_a_linear_curve_matches_its_closed_form(num_steps):
    # The debiased average of l_t = t: t - (1-b) / (1-b^(t+1)) * sum_j j b^j, the sum in closed form.
    beta, t = curve.sweep_smoothing(num_steps), np.arange(num_steps, dtype=float)
    weighted = beta * (1 - (t + 1) * beta**t + t * beta ** (t + 1)) / (1 - beta) ** 2
    expected = t - (1 - beta) / (1 - beta ** (t + 1)) * weighted
    smoothed = curve.smooth(t, beta)
    np.testing.assert_allclose(smoothed, expected, rtol=1e-12, atol=1e-12)
    # The lag at the sweep's end is the same share of the sweep whatever its length; 0.98 at 40
    # steps lags further behind.
    assert (t[-1] - smoothed[-1]) / num_steps == pytest.approx(0.32, abs=0.03)
    assert t[-1] - curve.smooth(np.arange(40.0), 0.98)[-1] > 0.4 * 40


def test_bad_arguments():
    with pytest.raises(ValueError, match="Argument `factor` must be"):
        RangeTestStart(np.zeros((4, 1)), factor=1.0)
    with pytest.raises(ValueError, match="Argument `rule` must be one of"):
        RangeTestStart(np.zeros((4, 1)), rule="lowest")
    with pytest.raises(TypeError, match="Argument `range_test` must be a kadapt.meta.RangeTestStart"):
        MetaAdjuster(constant_meta_model(KEEP), range_test=True)
