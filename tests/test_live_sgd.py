"""kadapt.optimizers.SGD: momentum and the LR multiplier change mid-fit,
proven by the weights against a NumPy heavy-ball oracle."""

import keras
import numpy as np
import pytest

import kadapt

pytestmark = pytest.mark.backends("tensorflow", "jax")

ROWS, FEATURES, LR = 16, 3, 0.05


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(ROWS, FEATURES)).astype("float32"), rng.normal(size=(ROWS, 1)).astype("float32")


def _linear(optimizer):
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _oracle(momenta, multipliers, nesterov=False):
    """Full-batch heavy-ball SGD on mean squared error, in float64."""
    x, y = (a.astype(np.float64) for a in _data())
    w, velocity = np.ones((FEATURES, 1)), np.zeros((FEATURES, 1))
    for momentum, multiplier in zip(momenta, multipliers):
        gradient = 2.0 / ROWS * x.T @ (x @ w - y)
        rate = LR * multiplier
        velocity = momentum * velocity - rate * gradient
        w = w + (momentum * velocity - rate * gradient if nesterov else velocity)
    return w


class SetEachStep(keras.callbacks.Callback):
    def __init__(self, attribute, values):
        super().__init__()
        self.attribute, self.values = attribute, values

    def on_train_batch_begin(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        setattr(self.model.optimizer, self.attribute, self.values[step])


def _fit(model, steps, callbacks=()):
    """`steps` full-batch steps in ONE epoch: on JAX, Keras syncs the trainer's state into the
    variables at each epoch's end only, so a change between steps inside an epoch is the test."""
    x, y = _data()
    x, y = np.concatenate([x] * steps), np.concatenate([y] * steps)
    model.fit(x, y, batch_size=ROWS, epochs=1, verbose=0, shuffle=False, callbacks=list(callbacks))
    return model.get_weights()[0]


@pytest.mark.parametrize("nesterov", [False, True])
def test_constant_momentum_matches_keras_sgd(nesterov):
    ours = _fit(_linear(kadapt.optimizers.SGD(LR, momentum=0.9, nesterov=nesterov)), 5)
    theirs = _fit(_linear(keras.optimizers.SGD(LR, momentum=0.9, nesterov=nesterov)), 5)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_momentum_changed_mid_fit_takes_effect():
    momenta = [0.0, 0.0, 0.9, 0.9, 0.5, 0.99]
    weights = _fit(_linear(kadapt.optimizers.SGD(LR)), 6, [SetEachStep("momentum", momenta)])
    np.testing.assert_allclose(weights, _oracle(momenta, [1.0] * 6), rtol=1e-5)
    # Without the change the weights differ: the test can fail.
    assert not np.allclose(weights, _oracle([0.0] * 6, [1.0] * 6), rtol=1e-3)


def test_momentum_scheduler_drives_the_momentum():
    schedule = kadapt.CosineMomentum(0.95, 0.5, total_steps=6, warmup_steps=2)
    weights = _fit(_linear(kadapt.optimizers.SGD(LR, momentum=0.9)), 6, [kadapt.MomentumScheduler(schedule)])
    momenta = [float(schedule(step)) for step in range(6)]
    np.testing.assert_allclose(weights, _oracle(momenta, [1.0] * 6), rtol=1e-5)


class SetAtBatchEnd(keras.callbacks.Callback):
    """Sets the momentum once, after a step, as the MetaAdjuster's momentum action does."""

    def __init__(self, step, momentum):
        super().__init__()
        self.step, self.momentum = step, momentum

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step + 1:
            self.model.optimizer.momentum = self.momentum


def test_momentum_scheduler_yields_to_a_momentum_set_by_another_callback():
    schedule = kadapt.CosineMomentum(0.95, 0.5, total_steps=6, warmup_steps=2)
    scheduler = kadapt.MomentumScheduler(schedule)
    weights = _fit(_linear(kadapt.optimizers.SGD(LR, momentum=0.9)), 6, [scheduler, SetAtBatchEnd(2, 0.3)])
    momenta = [float(schedule(step)) for step in range(3)] + [0.3] * 3
    np.testing.assert_allclose(weights, _oracle(momenta, [1.0] * 6), rtol=1e-5)
    assert scheduler.yielded_at_step == 3
    # Had the schedule overridden the change, the weights would follow the schedule alone.
    scheduled = [float(schedule(step)) for step in range(6)]
    assert not np.allclose(weights, _oracle(scheduled, [1.0] * 6), rtol=1e-3)


def test_learning_rate_multiplier_changes_a_scheduled_rate_mid_fit():
    multipliers = [1.0, 1.0, 10.0, 0.1, 1.0]
    schedule = kadapt.CosineAnnealing(LR, LR, total_steps=5)  # constant, yet a schedule
    model = _linear(kadapt.optimizers.SGD(schedule, momentum=0.5))
    weights = _fit(model, 5, [SetEachStep("learning_rate_multiplier", multipliers)])
    np.testing.assert_allclose(weights, _oracle([0.5] * 5, multipliers), rtol=1e-5)


def test_keras_sgd_is_refused_rather_than_silently_ignored():
    model = _linear(keras.optimizers.SGD(LR, momentum=0.9))
    with pytest.raises(TypeError, match=r"compiles it as a constant.*Received: optimizer=SGD"):
        _fit(model, 1, [kadapt.MomentumScheduler(kadapt.CosineMomentum(0.95, 0.85, 10))])


def test_live_sgd_round_trips_through_a_keras_file(tmp_path):
    model = _linear(kadapt.optimizers.SGD(LR, momentum=0.7, nesterov=True))
    _fit(model, 2)
    model.optimizer.momentum = 0.8
    model.save(tmp_path / "m.keras")
    restored = keras.models.load_model(tmp_path / "m.keras", safe_mode=True)
    assert float(restored.optimizer.momentum.numpy()) == pytest.approx(0.8)
    np.testing.assert_allclose(_fit(restored, 2), _fit(model, 2), rtol=1e-6)


def test_bad_optimizer_arguments():
    with pytest.raises(ValueError, match=r"`momentum` must be in \[0.0, 1.0\). Received: momentum=1.0"):
        kadapt.optimizers.SGD(momentum=1.0)
    with pytest.raises(ValueError, match=r"Received: learning_rate_multiplier=0.0"):
        kadapt.optimizers.SGD(learning_rate_multiplier=0.0)
    with pytest.raises(TypeError, match="`schedule` must be a callable"):
        kadapt.MomentumScheduler(0.9)


def test_live_momentum_under_accumulation_counts_logical_steps():
    momenta = [0.0, 0.9, 0.3, 0.6]
    model = kadapt.accumulate(_linear(kadapt.optimizers.SGD(LR)), 4)  # 4 micro-batches a step
    weights = _fit(model, 4, [SetEachStep("momentum", momenta)])
    np.testing.assert_allclose(weights, _oracle(momenta, [1.0] * 4), rtol=1e-5)
