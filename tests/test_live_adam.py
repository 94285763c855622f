"""kadapt.optimizers.Adam: beta_1 changes mid-fit, proven by the weights."""

import keras
import numpy as np
import pytest

import kadapt
from test_live_sgd import ROWS, FEATURES, SetEachStep, _data, _fit, _linear

pytestmark = pytest.mark.backends("tensorflow", "jax")

LR, BETA_2, EPSILON = 0.05, 0.999, 1e-7


def _adam_oracle(betas, multipliers):
    """Full-batch Adam (Keras' form) on mean squared error, in float64."""
    x, y = (a.astype(np.float64) for a in _data())
    w = np.ones((FEATURES, 1))
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, (beta_1, multiplier) in enumerate(zip(betas, multipliers), start=1):
        g = 2.0 / ROWS * x.T @ (x @ w - y)
        alpha = LR * multiplier * np.sqrt(1 - BETA_2**t) / (1 - beta_1**t)
        m += (g - m) * (1 - beta_1)
        v += (g * g - v) * (1 - BETA_2)
        w -= m * alpha / (np.sqrt(v) + EPSILON)
    return w


def test_constant_beta_1_matches_keras_adam():
    ours = _fit(_linear(kadapt.optimizers.Adam(LR)), 5)
    theirs = _fit(_linear(keras.optimizers.Adam(LR)), 5)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_beta_1_and_multiplier_changed_mid_fit_take_effect():
    betas = [0.9, 0.9, 0.5, 0.99, 0.7]
    multipliers = [1.0, 2.0, 1.0, 0.5, 1.0]
    callbacks = [SetEachStep("beta_1", betas), SetEachStep("learning_rate_multiplier", multipliers)]
    weights = _fit(_linear(kadapt.optimizers.Adam(LR)), 5, callbacks)
    # float32 against a float64 oracle; Adam's division by sqrt(v) amplifies
    # rounding, so 5e-5 (a change of beta_1 moves the weights by > 1e-3).
    np.testing.assert_allclose(weights, _adam_oracle(betas, multipliers), rtol=5e-5)
    assert not np.allclose(weights, _adam_oracle([0.9] * 5, [1.0] * 5), rtol=1e-3)


def test_momentum_scheduler_drives_beta_1():
    schedule = kadapt.CosineMomentum(0.95, 0.6, total_steps=5, warmup_steps=1)
    weights = _fit(_linear(kadapt.optimizers.Adam(LR)), 5, [kadapt.MomentumScheduler(schedule)])
    betas = [float(schedule(step)) for step in range(5)]
    np.testing.assert_allclose(weights, _adam_oracle(betas, [1.0] * 5), rtol=5e-5)


def test_keras_adam_is_refused_and_adam_round_trips(tmp_path):
    with pytest.raises(TypeError, match=r"Received: optimizer=Adam"):
        _fit(_linear(keras.optimizers.Adam(LR)), 1, [kadapt.MomentumScheduler(lambda step: 0.9)])
    model = _linear(kadapt.optimizers.Adam(LR, beta_1=0.8))
    _fit(model, 2)
    model.save(tmp_path / "m.keras")
    restored = keras.models.load_model(tmp_path / "m.keras", safe_mode=True)
    assert float(restored.optimizer.beta_1.numpy()) == pytest.approx(0.8)
    np.testing.assert_allclose(_fit(restored, 2), _fit(model, 2), rtol=1e-6)
