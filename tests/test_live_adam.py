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


class RestartAt(keras.callbacks.Callback):
    """Takes a rollback point before the first step and, before step `at`, goes back to it
    with the slots restarted, as the MetaAdjuster's restart and the dead-run rescue do."""

    def __init__(self, at):
        super().__init__()
        self.at, self.point = at, None

    def on_train_batch_begin(self, batch, logs=None):
        from kadapt.meta.observe import rollback

        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        if step == 0:
            self.point = rollback.take(self.model)
        elif step == self.at:
            rollback.restore(self.model, self.point, restart_momentum=True)


def test_after_a_restart_to_the_initial_state_the_steps_are_a_fresh_adams():
    """The moments restart at zero while `iterations` counts on (a schedule reads it); the bias
    correction counts from the restart, so the 3 steps after it are 3 steps of a fresh Adam."""
    model = _linear(kadapt.optimizers.Adam(LR))
    model.optimizer.build(model.trainable_variables)
    weights = _fit(model, 6, [RestartAt(3)])
    np.testing.assert_allclose(weights, _adam_oracle([0.9] * 3, [1.0] * 3), rtol=5e-5)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 6


def test_a_file_saved_before_moments_from_existed_loads_counting_from_zero():
    model = _linear(kadapt.optimizers.Adam(LR))
    _fit(model, 2)
    store = {}
    model.optimizer.save_own_variables(store)
    del store[str(len(store) - 1)]  # the last variable, moments_from, absent from older files
    fresh = _linear(kadapt.optimizers.Adam(LR))
    fresh.optimizer.build(fresh.trainable_variables)
    fresh.optimizer.load_own_variables(store)
    for index, variable in enumerate(fresh.optimizer.variables[:-1]):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), store[str(index)])
    assert int(keras.ops.convert_to_numpy(fresh.optimizer.iterations)) == 2
    assert fresh.optimizer.variables[-1].name == "moments_from"
    assert int(keras.ops.convert_to_numpy(fresh.optimizer.variables[-1])) == 0
